"""Request ids a client may set (HTTP ``X-Request-Id``, gRPC metadata) and the server echoes and logs.

The id is written into every log line of the request and back into the answer, so what a client
sends is taken only when it is short and plain: 1 to 128 visible ASCII characters (no spaces, no
control characters). Anything else is replaced by an id of the server's own, as if none was sent.
"""

from __future__ import annotations

import itertools
import os
import re

MAX_REQUEST_ID_CHARS = 128
_PLAIN = re.compile(rf"[!-~]{{1,{MAX_REQUEST_ID_CHARS}}}")


def client_request_id(value: str | None) -> str | None:
    """The client's id when it is plain enough to echo and log; None when the server should make one."""
    if value and _PLAIN.fullmatch(value):
        return value
    return None


class RequestIds:
    """The server's own request ids: a random prefix per listener and a counter.

    Unique within the process and across restarts (the prefix), and a few times cheaper than
    ``uuid4`` (which reads the OS random source on every call: 2 % of the gRPC event loop's samples).
    """

    def __init__(self) -> None:
        self._prefix = os.urandom(6).hex()
        self._counter = itertools.count(1)

    def new(self) -> str:
        return f"{self._prefix}{next(self._counter):x}"

    def of(self, client_value: str | None) -> str:
        """The client's id when it is plain enough to echo, else a new one of ours."""
        return client_request_id(client_value) or self.new()
