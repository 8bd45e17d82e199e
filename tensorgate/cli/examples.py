"""``tensorgate examples DIR``: the bundled example models written into a repository of one's own,
to edit, add versions to and serve (``tensorgate serve --model-repository DIR``).

``--workloads [yolov8,resnet50,bert]`` writes the bundled workloads instead (a YOLOv8s detector
behind an encoded-image pipeline, ResNet-50, a BERT-base classifier behind a tokenizer): real
architectures with random weights, built on first use into a cache (minutes, and the ``workloads``
extra: torch, transformers, tokenizers, Pillow).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tensorgate.examples import EXAMPLE_MODELS, build_example_repository


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="the model repository to write them into (made if missing)")
    parser.add_argument(
        "--workloads",
        nargs="?",
        const="yolov8,resnet50,bert",
        default=None,
        metavar="LIST",
        help="write the bundled workloads instead of the small examples: all, or a comma-separated "
        "subset of yolov8,resnet50,bert (built on first use into the cache; needs the workloads extra)",
    )
    parser.add_argument(
        "--workload-size",
        choices=("full", "test"),
        default="full",
        help="full: the real sizes (YOLOv8s, ResNet-50, BERT-base); test: the same layers, slimmed, in seconds",
    )


def run(args: argparse.Namespace) -> int:
    target: Path = args.directory
    if target.exists() and not target.is_dir():
        print(f"tensorgate examples: {target} is not a directory", file=sys.stderr)
        return 2
    if args.workloads is not None:
        return _workloads(target, args.workloads, args.workload_size)
    present = sorted(name for name in EXAMPLE_MODELS if (target / name).exists())
    if present:  # never overwrite a model someone may have edited
        print(f"tensorgate examples: {target} already holds {', '.join(present)}; nothing written", file=sys.stderr)
        return 1
    build_example_repository(target)
    print(f"wrote {', '.join(sorted(EXAMPLE_MODELS))} to {target}")
    return 0


def _workloads(target: Path, chosen: str, size: str) -> int:
    try:
        from tensorgate.examples.workloads import MODELS, WORKLOADS, build_workload_repository
    except ImportError as exc:  # pragma: no cover - the module itself imports nothing optional
        print(f"tensorgate examples: {exc}", file=sys.stderr)
        return 1
    names = [part.strip() for part in chosen.split(",") if part.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        print(
            f"tensorgate examples: unknown workload(s) {', '.join(unknown) or '(none named)'}; "
            f"choose from {', '.join(WORKLOADS)}",
            file=sys.stderr,
        )
        return 2
    present = sorted(model for name in names for model in MODELS[name] if (target / model).exists())
    if present:
        print(f"tensorgate examples: {target} already holds {', '.join(present)}; nothing written", file=sys.stderr)
        return 1
    try:
        written = build_workload_repository(target, names, size)
    except ModuleNotFoundError as exc:
        print(
            f"tensorgate examples: building the workloads needs {exc.name}: pip install 'tensorgate[workloads]'",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {', '.join(written)} to {target}")
    return 0
