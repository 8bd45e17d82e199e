"""The HTTP route table: a method and a path -> one handler and the path's parameters.

Every route of the server is in one :class:`RouteTable`, so a path no route takes is one 404, a
method a route does not take is one 405 that names the methods it does (``Allow``, RFC 9110
§15.5.6), and HEAD is taken wherever GET is. Paths are matched segment by segment in a tree of
dictionaries (a few lookups per request, whatever the number of routes); a literal segment wins
over a parameter (``/v2/models/stats`` over ``/v2/models/{model}``). A colon in a path's last
segment starts a segment of its own, for KServe V1's ``/v1/models/{model}:predict``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from tensorgate.errors import MethodNotAllowed, NotFound

Params = dict[str, str]
# (call, params, receive, send): every route takes the same four.
Handler = Callable[[Any, Params, Any, Any], Awaitable[None]]


class WrongMethod(MethodNotAllowed):
    """A route that takes other methods: 405 with their names in ``allow``."""

    def __init__(self, message: str, allow: str) -> None:
        super().__init__(message)
        self.allow = allow.encode()


class _Node:
    __slots__ = ("children", "methods", "param", "param_name")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.param: _Node | None = None
        self.param_name = ""
        self.methods: dict[str, Handler] = {}


def split_path(path: str) -> list[str]:
    """``/v2/models/m/infer`` -> ["v2", "models", "m", "infer"]; ``/v1/models/m:predict`` ->
    ["v1", "models", "m", ":predict"]; ``/`` -> [""]. ``path`` is as sent, percent-encoded: each
    segment is decoded after the split, so an encoded slash stays inside its segment (RFC 3986 §2.2)
    and ``/v2/models/..%2Fetc/ready`` names a model called ``../etc``, which its route refuses."""
    parts = path.strip("/").split("/")
    if "%" in path:
        parts = [unquote(part) if "%" in part else part for part in parts]
    last = parts[-1]
    colon = last.find(":")
    if colon > 0:
        parts[-1:] = [last[:colon], last[colon:]]
    return parts


class RouteTable:
    def __init__(self) -> None:
        self._root = _Node()
        self._listed: list[tuple[str, str]] = []

    def routes(self) -> list[tuple[str, str]]:
        """Every (method, pattern) served, in the order added (the OpenAPI document is checked
        against this list)."""
        return list(self._listed)

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        """``pattern``: ``/v2/models/{model}/infer``; a ``{name}`` segment takes any one segment."""
        node = self._root
        for segment in split_path(pattern):
            if segment.startswith("{") and segment.endswith("}"):
                name = segment[1:-1]
                if node.param is None:
                    node.param, node.param_name = _Node(), name
                elif node.param_name != name:
                    raise ValueError(f"{pattern}: parameter {{{name}}} where another route has {{{node.param_name}}}")
                node = node.param
            else:
                node = node.children.setdefault(segment, _Node())
        if method in node.methods:
            raise ValueError(f"{method} {pattern} is routed twice")
        node.methods[method] = handler
        self._listed.append((method, pattern))

    def match(self, method: str, path: str, parts: list[str]) -> tuple[Handler, Params]:
        """The handler and parameters for ``parts`` (``split_path(path)``); NotFound or WrongMethod."""
        params: Params = {}
        node = _find(self._root, parts, 0, params)
        if node is None:
            raise NotFound(f"no route for {path[:200]}")
        handler = node.methods.get(method)
        if handler is None and method == "HEAD":
            handler = node.methods.get("GET")
        if handler is None:
            allow = sorted(node.methods)
            if "GET" in node.methods:
                allow.append("HEAD")
            names = ", ".join(allow)
            raise WrongMethod(f"{method[:20]} is not allowed on {path[:200]}; use {names}", names)
        return handler, params


def _find(node: _Node, parts: list[str], index: int, params: Params) -> _Node | None:
    if index == len(parts):
        return node if node.methods else None
    segment = parts[index]
    child = node.children.get(segment)
    if child is not None:
        found = _find(child, parts, index + 1, params)
        if found is not None:
            return found
    if node.param is not None and segment:
        found = _find(node.param, parts, index + 1, params)
        if found is not None:
            params[node.param_name] = segment
            return found
    return None
