"""Disconnect watches: started late, and only for requests still running; a disconnect cancels."""

from __future__ import annotations

import asyncio
from typing import Any

from tensorgate.protocols.http.disconnect import ConnectionWatch, DisconnectWatches


class _Client:
    """A receive() that records being called and answers when told."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def receive(self) -> dict[str, Any]:
        self.called.set()
        return await self.answer


async def test_a_request_that_ends_early_is_never_watched_and_a_later_one_is() -> None:
    watches = DisconnectWatches()
    quick, slow = _Client(), _Client()
    never_done = asyncio.get_running_loop().create_future()
    request = asyncio.ensure_future(never_done)
    watches.watch(quick.receive, request).close()  # answered at once
    watch = watches.watch(slow.receive, request)
    await asyncio.wait_for(slow.called.wait(), 5)  # the sweep reached both
    assert not quick.called.is_set()
    watch.close()
    request.cancel()


async def test_a_disconnect_cancels_the_request_and_says_so() -> None:
    watches = DisconnectWatches()
    client = _Client()

    async def request() -> None:
        await asyncio.get_running_loop().create_future()  # waits for its batch, which never comes

    task = asyncio.create_task(request())
    watch = watches.watch(client.receive, task)
    await asyncio.wait_for(client.called.wait(), 5)
    client.answer.set_result({"type": "http.disconnect"})
    try:
        await asyncio.wait_for(task, 5)
    except asyncio.CancelledError:
        pass
    assert task.cancelled() and watch.disconnected
    watch.close()


async def test_many_requests_in_flight_are_each_watched() -> None:
    watches = DisconnectWatches()
    clients = [_Client() for _ in range(50)]
    request = asyncio.ensure_future(asyncio.get_running_loop().create_future())
    kept = [watches.watch(c.receive, request) for c in clients]
    await asyncio.wait_for(asyncio.gather(*(c.called.wait() for c in clients)), 5)
    for watch in kept:
        assert not watch.disconnected
        watch.close()
    request.cancel()


async def test_a_connection_watch_cancels_the_armed_request_and_one_armed_after_the_loss() -> None:
    watch = ConnectionWatch()
    first = asyncio.ensure_future(asyncio.sleep(60))
    watch.arm(first).close()  # answered: a loss now concerns no request
    watch.lost()
    assert not first.cancelled() and not watch.disconnected
    # The client left while its body was still being decoded: arming the watch cancels at once.
    late = asyncio.ensure_future(asyncio.sleep(60))
    watch.arm(late)
    assert watch.disconnected
    await asyncio.sleep(0)
    assert late.cancelled()
    first.cancel()
