"""``tensorgate examples DIR``: the bundled example models written into a repository of one's own,
to edit, add versions to and serve (``tensorgate serve --model-repository DIR``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tensorgate.examples import EXAMPLE_MODELS, build_example_repository


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="the model repository to write them into (made if missing)")


def run(args: argparse.Namespace) -> int:
    target: Path = args.directory
    if target.exists() and not target.is_dir():
        print(f"tensorgate examples: {target} is not a directory", file=sys.stderr)
        return 2
    present = sorted(name for name in EXAMPLE_MODELS if (target / name).exists())
    if present:  # never overwrite a model someone may have edited
        print(f"tensorgate examples: {target} already holds {', '.join(present)}; nothing written", file=sys.stderr)
        return 1
    build_example_repository(target)
    print(f"wrote {', '.join(sorted(EXAMPLE_MODELS))} to {target}")
    return 0
