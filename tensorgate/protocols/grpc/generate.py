"""Regenerate the committed gRPC stubs in ``generated/`` from ``protos/``.

Run ``python -m tensorgate.protocols.grpc.generate`` after editing a ``.proto``;
``tests/grpc/test_generated.py`` fails when the committed files differ from what this produces, so
stubs and protos never drift. The output depends on the protoc bundled with grpcio-tools, so the
dev extra pins grpcio-tools exactly.

Two deterministic rewrites follow protoc:

- imports between the stubs become package-relative (protoc writes top-level ``import x_pb2``),
  and the ``.pyi`` stubs are marked ``mypy: ignore-errors`` (protoc's stubs fail ``--strict``);
- the descriptors go into a private pool (``generated/_pool.py``) instead of protobuf's default
  pool. Our protos reuse Triton's file and symbol names (``inference.ModelInferRequest``; the
  service name is on the wire), and ``tritonclient.grpc`` registers the same names in the default
  pool: sharing it would make importing both in one process fail with "duplicate symbol".
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = HERE / "protos"
GENERATED = HERE / "generated"
PROTO_FILES = ("model_config.proto", "grpc_service.proto")

_SIBLING_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)
_DEFAULT_POOL = "_descriptor_pool.Default()"
_PRIVATE_POOL = "_pool.POOL"


def _rewrite(name: str, text: str) -> str:
    text = _SIBLING_IMPORT.sub(r"from . import \1 as \2", text)
    if name.endswith(".pyi"):
        # protoc's stubs do not pass mypy --strict (bare Mapping); they are still used for types.
        text = "# mypy: ignore-errors\n" + text
    if name.endswith("_pb2.py"):
        if _DEFAULT_POOL not in text:
            raise RuntimeError(f"{name}: protoc output no longer registers in the default pool; update generate.py")
        text = text.replace(_DEFAULT_POOL, _PRIVATE_POOL)
        text = text.replace(
            "from google.protobuf.internal import builder as _builder\n",
            "from google.protobuf.internal import builder as _builder\nfrom . import _pool\n",
            1,
        )
    return text


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) over ``protos/`` and write the rewritten stubs to ``out_dir``."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # a dev dependency: only to regenerate

    include = Path(protoc.__file__).resolve().parent / "_proto"
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *PROTO_FILES,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed; see its messages above")
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(Path(tmp).iterdir()):
            target = out_dir / path.name
            target.write_text(_rewrite(path.name, path.read_text()))
            written.append(target)
    return written


def main() -> int:
    for path in generate(GENERATED):
        print(path.relative_to(HERE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
