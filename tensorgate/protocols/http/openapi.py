"""The OpenAPI document of the HTTP API (``openapi.yaml`` beside this module), served as JSON.

The YAML file is the source: it ships as package data, and ``tests/e2e/test_openapi_conformance.py``
holds the server to it with Schemathesis. It is read once, when the app is built at startup.
"""

from __future__ import annotations

from importlib.resources import files

import orjson
import yaml


def openapi_json() -> bytes:
    """The document as JSON bytes for ``GET /openapi.json``. Called once, by the app's constructor
    at server startup (parsing the YAML takes ~0.1 s: never per request)."""
    text = files("tensorgate.protocols.http").joinpath("openapi.yaml").read_text(encoding="utf-8")
    return orjson.dumps(yaml.safe_load(text))
