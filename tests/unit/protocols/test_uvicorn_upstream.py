"""The uvicorn functions that ``protocols/http/listener.py`` copies or overrides, pinned by a digest of
their source: when an upgrade changes one of them, this fails and names it, so the listener's copy
is compared with the new upstream code before the pin in pyproject.toml moves."""

from __future__ import annotations

import hashlib
import inspect

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

# uvicorn 0.55.0's. The parser callbacks are copied into _Protocol with our limits added; the
# others are overridden or called from overrides that rely on what they do.
UPSTREAM = {
    "HttpToolsProtocol.connection_made": "6efb565ff3d36b91",
    "HttpToolsProtocol.connection_lost": "c91a4c9bf2e29c55",
    "HttpToolsProtocol.data_received": "010a7ae59a5d3b1a",
    "HttpToolsProtocol.on_message_begin": "96d377fdc7c2baef",
    "HttpToolsProtocol.on_url": "37be44e962b04ca8",
    "HttpToolsProtocol.on_header": "1e86ebb6cea0458c",
    "HttpToolsProtocol.on_headers_complete": "1ea8589acfad92d8",
    "HttpToolsProtocol.on_body": "dba9c32aeba35b6a",
    "HttpToolsProtocol.on_message_complete": "1fbad42dc31fc01f",
    "HttpToolsProtocol.send_400_response": "ae5a4a3782b646fd",
    "HttpToolsProtocol.on_response_complete": "64e254f28e389e76",
    "HttpToolsProtocol.timeout_keep_alive_handler": "8b53bf5f2e202970",
    "HttpToolsProtocol._start_asgi_task": "8d0189e65525db42",
    "HttpToolsProtocol.shutdown": "d7351fa33f00d430",
    "RequestResponseCycle.send": "abdd8601b326a8da",
    "RequestResponseCycle.receive": "8124ae006be71184",
    "Server.capture_signals": "e1bbcd4770d1c887",
    "Server.startup": "2aa1d70a244bfcf2",
    "Server.shutdown": "5d01b8b1f116a786",
    "Server.main_loop": "afccb353a119333f",
}
CLASSES = {
    "HttpToolsProtocol": HttpToolsProtocol,
    "RequestResponseCycle": RequestResponseCycle,
    "Server": uvicorn.Server,
}


def test_the_uvicorn_code_the_listener_copies_is_unchanged() -> None:
    changed = []
    for qualified, digest in UPSTREAM.items():
        owner, name = qualified.split(".")
        source = inspect.getsource(getattr(CLASSES[owner], name))
        if hashlib.sha256(source.encode()).hexdigest()[:16] != digest:
            changed.append(qualified)
    assert not changed, (
        f"uvicorn {uvicorn.__version__} changed {', '.join(changed)}: compare with the copies and overrides "
        "in tensorgate/protocols/http/listener.py, then update these digests"
    )
