"""The load generator's gRPC client against grpcio's own server (another HTTP/2 implementation, with
small flow-control windows of its own), in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tensorgate.bench.grpc_client import GrpcConnection, connect, framed
from tensorgate.bench.http_client import ConnectionLost
from tensorgate.bench.targets.base import Endpoint


class Service:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

    async def echo(self, request: bytes, context: Any) -> bytes:
        self.sizes.append(len(request))
        return request[:1000]

    async def fail(self, request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "nope, not this one")
        raise AssertionError("abort returned")

    async def slow(self, request: bytes, context: Any) -> bytes:
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""


@pytest.fixture()
async def served() -> AsyncIterator[tuple[Service, grpc.aio.Server, int]]:
    service = Service()
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    handlers = {name: grpc.unary_unary_rpc_method_handler(getattr(service, name)) for name in ("echo", "fail", "slow")}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield service, server, port
    await server.stop(None)


@pytest.fixture()
async def connection(served: tuple[Service, grpc.aio.Server, int]) -> AsyncIterator[GrpcConnection]:
    conn = await connect(Endpoint("127.0.0.1", served[2], ""))
    yield conn
    assert conn.transport is not None
    conn.transport.close()


async def test_calls_larger_than_the_servers_windows_go_through(
    served: tuple[Service, grpc.aio.Server, int], connection: GrpcConnection
) -> None:
    sizes = [600_000, 5_000_000, 10, 0]  # grpc's windows start at 64 KiB
    for size in sizes:
        status = await asyncio.wait_for(connection.call("/t.S/echo", framed(b"\x01" * size)), 30)
        assert (status.code, status.message) == (0, "")
    assert served[0].sizes == sizes


async def test_a_failed_call_reports_its_code_and_message(connection: GrpcConnection) -> None:
    status = await asyncio.wait_for(connection.call("/t.S/fail", framed(b"x")), 30)
    assert (status.code, status.message) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], "nope, not this one")
    unserved = await asyncio.wait_for(connection.call("/t.S/none", framed(b"x")), 30)
    assert unserved.code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert (await asyncio.wait_for(connection.call("/t.S/echo", framed(b"x")), 30)).code == 0


async def test_a_cancelled_call_resets_its_stream_and_the_connection_goes_on(
    served: tuple[Service, grpc.aio.Server, int], connection: GrpcConnection
) -> None:
    call = asyncio.ensure_future(connection.call("/t.S/slow", framed(b"x")))
    await asyncio.wait_for(served[0].started.wait(), 30)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(served[0].cancelled.wait(), 30)  # the server saw the reset
    assert connection.usable
    assert (await asyncio.wait_for(connection.call("/t.S/echo", framed(b"y")), 30)).code == 0


async def test_a_server_that_goes_away_fails_the_call(
    served: tuple[Service, grpc.aio.Server, int], connection: GrpcConnection
) -> None:
    call = asyncio.ensure_future(connection.call("/t.S/slow", framed(b"x")))
    await asyncio.wait_for(served[0].started.wait(), 30)
    await served[1].stop(None)  # no grace: calls in flight are cancelled, connections closed
    try:
        status = await asyncio.wait_for(call, 30)
    except ConnectionLost:
        pass
    else:
        assert status.code != 0
    assert not connection.usable or not await _still_answers(connection)


async def _still_answers(connection: GrpcConnection) -> bool:
    try:
        return (await asyncio.wait_for(connection.call("/t.S/echo", framed(b"z")), 10)).code == 0
    except ConnectionLost:
        return False
