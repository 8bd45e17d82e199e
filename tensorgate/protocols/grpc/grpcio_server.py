"""The same services on grpcio's own server (``grpc.aio``), selected by ``server.grpc_transport: grpcio``.

It exists to measure tensorgate's HTTP/2 transport against the library it replaces, side by side
(``benchmarks/bench_grpc_transport.py``). It serves what the listener registers, unchanged, and
stops like :class:`~tensorgate.protocols.grpc.server.GrpcServer` (GOAWAY, a grace period, then
UNAVAILABLE), except that health ``Watch`` streams end only when the grace period does. grpcio's
server offers no hook that runs tensorgate's gate on a call's headers and hands the caller's
identity to the servicer, no connection cap, and takes its certificates in a form of its own, so
configuration refuses this transport with ``auth``, ``max_connections`` or ``tls``.
"""

from __future__ import annotations

from typing import Any

import grpc


class GrpcioServer:
    """What :class:`GrpcListener` needs of a server: a method table to fill, start and stop."""

    def __init__(self, max_receive_bytes: int, max_send_bytes: int, max_concurrent_streams: int) -> None:
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_receive_bytes),
                ("grpc.max_send_message_length", max_send_bytes),
                ("grpc.max_concurrent_streams", max_concurrent_streams),
                ("grpc.so_reuseport", 0),  # a port taken by another server must fail to bind, as ours does
            ]
        )

    @property
    def methods(self) -> Any:
        """Where servicers register (``grpc.aio.Server`` takes what a MethodTable takes)."""
        return self._server

    async def start(self, host: str | None, port: int) -> int:
        address = f"[{host}]:{port}" if host and ":" in host else f"{host or '0.0.0.0'}:{port}"
        try:
            bound = self._server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio raises this where the address is taken
            raise OSError(f"cannot bind {address}") from exc
        if bound == 0:
            raise OSError(f"cannot bind {address}")
        await self._server.start()
        return int(bound)

    async def stop(self, grace_s: float) -> None:
        await self._server.stop(grace_s)
