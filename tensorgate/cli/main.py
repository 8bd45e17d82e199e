"""The ``tensorgate`` command."""

from __future__ import annotations

import argparse
import sys

from tensorgate.cli import bench, examples, serve
from tensorgate.version import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorgate", description="A production inference server.")
    parser.add_argument("--version", action="version", version=f"tensorgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    serve.add_arguments(serve_parser)
    bench.add_arguments(commands.add_parser("bench", help="load a model server and check latency SLOs"))
    examples.add_arguments(commands.add_parser("examples", help="write the bundled example models to a directory"))
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve.run(args)
    if args.command == "bench":
        return bench.run(args)
    if args.command == "examples":
        return examples.run(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
