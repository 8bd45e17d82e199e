"""The connection watch: the request armed on a connection is cancelled when the connection is lost."""

from __future__ import annotations

import asyncio

from tensorgate.protocols.http.disconnect import ConnectionWatch


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
