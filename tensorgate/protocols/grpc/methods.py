"""The table of served RPCs: ``/package.Service/Method`` to grpc's method handler.

Servicers register here with the code grpc generates (``add_XServicer_to_server(servicer, table)``,
which calls the two ``add_*`` methods below), so the generated code, grpc_health and
grpc_reflection stay the source of the handlers, their (de)serializers and cardinalities; only the
transport is ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class _CallDetails:  # what grpc.GenericRpcHandler.service() is given
    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


class MethodTable:
    def __init__(self) -> None:
        self._registered: dict[str, Any] = {}
        self._generic: list[Any] = []

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self._generic.extend(handlers)

    def find(self, path: str, metadata: tuple[tuple[str, str | bytes], ...]) -> Any | None:
        """The ``grpc.RpcMethodHandler`` for ``path``, or None when nothing serves it."""
        handler = self._registered.get(path)
        if handler is not None:
            return handler
        details = _CallDetails(path, metadata)
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None
