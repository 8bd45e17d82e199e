"""``tensorgate serve`` with one of the HTTP listener's stand-ins for uvicorn's code turned off.

``bench_listener.py`` starts a server through this script, as ``ServerProcess``'s wrapper:
``python _uvicorn_cycle.py PART PYTHON -m tensorgate serve ARGS`` runs ``tensorgate serve ARGS`` in
this process with ``PART`` (``body-parts``: the listener's ``_BodyParts``) replaced by what uvicorn
itself does (a bytearray each chunk is appended to, copied whole on every read).
"""

from __future__ import annotations

import sys

from tensorgate.cli.main import main
from tensorgate.protocols.http import listener


class _UvicornBody(bytearray):
    """uvicorn's own body buffer, with the one method the listener calls on its stand-in."""

    def append(self, chunk: bytes) -> None:  # type: ignore[override]
        self += chunk


REPLACED = {"body-parts": ("_BodyParts", _UvicornBody)}

if __name__ == "__main__":
    part, _python, *command = sys.argv[1:]
    if part not in REPLACED or command[:2] != ["-m", "tensorgate"]:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(REPLACED)}}} PYTHON -m tensorgate serve ARGS")
    name, replacement = REPLACED[part]
    setattr(listener, name, replacement)
    sys.exit(main(command[2:]))
