"""Build: the modules every request passes through are compiled with mypyc.

The server's event loop is bound by the Python it runs per request (HTTP dispatch, decoding,
scheduling, splitting a batch's outputs, the access log), and compiled these modules take less of
it (``benchmarks/bench_front_end.py`` gives the event loop's CPU per request, on whichever build
is installed). They are already checked with ``mypy --strict``, which is what mypyc needs.
``TENSORGATE_PURE_PYTHON=1`` builds without it (for profiling with py-spy, which cannot see inside
compiled functions).

A module stays interpreted when it subclasses a class from a library (the HTTP listener's uvicorn
protocol, the gRPC servicer), or when mypyc's native classes would change what it does (the
metrics registry reads its own ``vars``; error classes override class attributes).

``tensorgate/_build.json`` records the sources that were compiled, so tests can refuse to run
against a compiled module whose source has changed since (see ``tests/conftest.py``).

Without a C compiler the build falls back to pure Python, with a warning: the server works the same,
a little slower. ``TENSORGATE_LIST_COMPILED=1 python setup.py`` prints the compiled sources, one per
line (the Makefile rebuilds when one of them changes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The request path of an inference, in the order a request meets them.
COMPILED = [
    "tensorgate/types.py",
    "tensorgate/clock.py",
    "tensorgate/protocols/http/app.py",
    "tensorgate/protocols/http/routes.py",
    "tensorgate/protocols/http/exchange.py",
    "tensorgate/protocols/http/inference_routes.py",
    "tensorgate/protocols/http/body.py",
    "tensorgate/protocols/http/disconnect.py",
    "tensorgate/protocols/http/v2_codec.py",
    "tensorgate/protocols/parameters.py",
    "tensorgate/protocols/request_ids.py",
    "tensorgate/protocols/tensor_codec.py",
    "tensorgate/protocols/grpc/http2/header_blocks.py",
    "tensorgate/protocols/grpc/call.py",
    "tensorgate/protocols/grpc/raw_inputs.py",
    "tensorgate/protocols/grpc/codec.py",
    "tensorgate/models/service.py",
    "tensorgate/models/router.py",
    "tensorgate/models/target.py",
    "tensorgate/models/model_version.py",
    "tensorgate/models/generative.py",
    "tensorgate/models/pipeline.py",
    "tensorgate/models/validation.py",
    "tensorgate/scheduling/scheduler.py",
    "tensorgate/scheduling/pending.py",
    "tensorgate/scheduling/statistics.py",
    "tensorgate/scheduling/request_queue.py",
    "tensorgate/scheduling/queue_order.py",
    "tensorgate/scheduling/batch_policy.py",
    "tensorgate/scheduling/batch_cost.py",
    "tensorgate/scheduling/deadline_admission.py",
    "tensorgate/instances/pool.py",
    "tensorgate/instances/thread_instance.py",
    "tensorgate/instances/batch_tensors.py",
    "tensorgate/observability/access_log.py",
    "tensorgate/observability/loop_metrics.py",
    "tensorgate/observability/trace_context.py",
]
MANIFEST = HERE / "tensorgate" / "_build.json"
GROUP = "tensorgate_native"  # the shared library the compiled modules live in (default: a hash of the list)
# setup.py runs once per build hook; only the ones that build code need the compiler.
_BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def remove_built() -> None:
    """An editable build compiles in place, and what an earlier build left there would still load:
    a module compiled then and dropped from the list since, or everything, for a pure build."""
    for stale in [*(HERE / "tensorgate").rglob("*.so"), *HERE.glob(GROUP + "__mypyc.*.so")]:
        stale.unlink()


def have_c_compiler() -> bool:
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(compiler.split()[0]) is not None


def ext_modules() -> list[object]:
    if not _BUILDS.intersection(sys.argv[1:]):
        return []
    remove_built()
    pure = bool(os.environ.get("TENSORGATE_PURE_PYTHON"))
    if not pure and not have_c_compiler():
        print(
            "warning: no C compiler found; tensorgate is installed as pure Python (it works the same, "
            "somewhat slower per request); install gcc and reinstall to compile the request path",
            file=sys.stderr,
        )
        pure = True
    if pure:
        MANIFEST.write_text(json.dumps({"compiled": {}, "pure": True}, indent=1) + "\n")
        return []
    from mypyc.build import mypycify

    # mypyc reads none of the project's mypy settings (make check holds the code to --strict): a
    # build that cannot see the runtime dependencies (pip's isolated build) then takes their types
    # as Any, which only makes the calls into them dynamic, instead of failing.
    options = [
        "--config-file=",
        "--ignore-missing-imports",
        "--follow-imports=silent",  # what the compiled modules import is read for its types, not checked
        "--cache-dir=build/mypyc-cache",
    ]
    # Read before mypyc reads them: a source edited while the build runs then shows as stale.
    digests = {path: source_digest(HERE / path) for path in COMPILED}
    modules = mypycify([*options, *COMPILED], opt_level="3", group_name=GROUP)
    MANIFEST.write_text(json.dumps({"compiled": digests, "pure": False}, indent=1) + "\n")
    return modules


if os.environ.get("TENSORGATE_LIST_COMPILED"):
    print("\n".join(COMPILED))
else:
    from setuptools import setup

    setup(ext_modules=ext_modules())
