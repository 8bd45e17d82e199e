"""Structured logs: JSON lines for machines, plain text for a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is a field.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def __init__(self, replica: str | None = None) -> None:
        super().__init__()
        self._replica = replica  # on every line, so the lines of several replicas can be told apart

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._replica is not None:
            entry["replica"] = self._replica
        for key, value in vars(record).items():
            if key not in _STANDARD:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self, replica: str | None = None) -> None:
        prefix = "" if replica is None else replica.replace("%", "%%") + " "
        super().__init__(prefix + "%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def configure_logging(level: str, fmt: str, access_log: bool, replica: str | None = None) -> None:
    import time

    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter = JsonFormatter(replica) if fmt == "json" else TextFormatter(replica)
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("tensorgate.access").setLevel(logging.INFO if access_log else logging.WARNING)
    for noisy in ("uvicorn.error", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
