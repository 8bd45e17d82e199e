"""``tensorgate serve`` with one of the HTTP listener's stand-ins for uvicorn's code turned off.

``bench_listener.py`` starts a server through this script, as ``ServerProcess``'s wrapper:
``python _uvicorn_cycle.py PART PYTHON -m tensorgate serve ARGS`` runs ``tensorgate serve ARGS`` in
this process with ``PART`` (``body-parts``: ``_BodyParts``) replaced by uvicorn's own code.
"""

from __future__ import annotations

import sys

from tensorgate.cli.main import main
from tensorgate.protocols.http import listener

FLAGS = {"body-parts": "_BODY_PARTS"}

if __name__ == "__main__":
    part, _python, *command = sys.argv[1:]
    if part not in FLAGS or command[:2] != ["-m", "tensorgate"]:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(FLAGS)}}} PYTHON -m tensorgate serve ARGS")
    setattr(listener, FLAGS[part], False)
    sys.exit(main(command[2:]))
