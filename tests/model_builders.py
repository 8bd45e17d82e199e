"""Model repositories built by tests: Python models with known timing and behaviour."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

# Adds 1 to its input after sleeping ``delay_ms``; ``first_call_ms`` makes the first call slow
# (the cost a warm-up must absorb). ``busy: true`` burns CPU holding the GIL instead of sleeping.
# ``running_dir``: a file named after the process id exists there while a batch runs (a test can
# then kill a worker in the middle of one).
DELAY_MODEL = """
import os
import time
from pathlib import Path

import numpy as np

from tensorgate import PythonModel


class Delay(PythonModel):
    def load(self, context):
        params = context.parameters
        self.delay = float(params.get("delay_ms", 10)) / 1000.0
        self.first = float(params.get("first_call_ms", 0)) / 1000.0
        self.busy = bool(params.get("busy", False))
        self.crash_marker = params.get("crash_marker")
        self.running = Path(params["running_dir"]) / str(os.getpid()) if "running_dir" in params else None

    def execute(self, inputs):
        if self.running is not None:
            self.running.touch()
        try:
            return self._execute(inputs)
        finally:
            if self.running is not None:
                self.running.unlink()

    def _execute(self, inputs):
        x = inputs["INPUT"]
        if self.first:
            time.sleep(self.first)
            self.first = 0.0
        if self.busy:
            end = time.perf_counter() + self.delay
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.delay)
        if float(np.min(x, initial=0.0)) < -1e6:
            raise ValueError("model refuses inputs below -1e6")
        return {"OUTPUT": (x + 1.0).astype(np.float32)}
"""


def write_python_model(
    repo: Path,
    name: str,
    *,
    code: str = DELAY_MODEL,
    width: int = 4,
    max_batch_size: int = 8,
    parameters: dict[str, Any] | None = None,
    **config: Any,
) -> Path:
    """A Python model ``INPUT`` FP32 [-1, width] -> ``OUTPUT`` FP32 [-1, width]."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(code)
    document: dict[str, Any] = {
        "backend": "python",
        "max_batch_size": max_batch_size,
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, width]}],
        "outputs": [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, width]}],
        "parameters": parameters or {},
        **config,
    }
    (model_dir / "config.yaml").write_text(yaml.safe_dump(document))
    return model_dir


def v2_body(values: list[list[float]], **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [len(values), len(values[0])], "data": values}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def wait_until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` until it holds, failing after ``timeout_s`` (never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


_SCRAPER: httpx.Client | None = None


def metric(url: str, name: str, headers: dict[str, str] | None = None, **labels: str) -> float:
    """The sum of the matching samples on a Prometheus endpoint (0 when absent); ``headers`` carry
    credentials where the metrics port asks for them.

    Blocking: from async tests call it through ``asyncio.to_thread``.
    """
    global _SCRAPER
    from prometheus_client.parser import text_string_to_metric_families

    if _SCRAPER is None:  # one client: creating one per call costs an SSL context each time
        _SCRAPER = httpx.Client(timeout=5.0)
    response = _SCRAPER.get(url, headers=headers)
    response.raise_for_status()
    text = response.text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


# Answers with its own version number in every element of OUTPUT, so a test can tell which
# version computed an answer (and compare it with the answer's model_version). The constants are
# written per version directory: one version can be slow, or fail every n-th batch.
VERSION_MODEL = """
import time

import numpy as np

from tensorgate import PythonModel

DELAY_S = {delay_s!r}
FAIL_EVERY = {fail_every!r}


class Versioned(PythonModel):
    def load(self, context):
        self.version = float(context.version)
        self.calls = 0

    def execute(self, inputs):
        self.calls += 1
        if DELAY_S:
            time.sleep(DELAY_S)
        if FAIL_EVERY and self.calls % FAIL_EVERY == 0:
            raise RuntimeError("a planted failure")
        return {{"OUTPUT": np.full(inputs["INPUT"].shape, self.version, dtype=np.float32)}}
"""


def write_version(
    model_dir: Path, version: int, *, delay_ms: float = 0.0, fail_every: int = 0, staging: Path | None = None
) -> Path:
    """One version directory of a VERSION_MODEL model. With ``staging``, the directory is written
    there and moved into place in one rename, as a deployment tool would."""
    target = model_dir / str(version)
    where = staging / f"{model_dir.name}-{version}" if staging is not None else target
    where.mkdir(parents=True, exist_ok=True)
    (where / "model.py").write_text(VERSION_MODEL.format(delay_s=delay_ms / 1000.0, fail_every=fail_every))
    if staging is not None:
        where.rename(target)
    return target


def write_versioned_model(repo: Path, name: str, versions: list[int], *, width: int = 4, **config: Any) -> Path:
    """A VERSION_MODEL model ``INPUT`` FP32 [-1, width] -> ``OUTPUT`` (its version) with these versions."""
    model_dir = write_python_model(
        repo, name, code=VERSION_MODEL.format(delay_s=0.0, fail_every=0), width=width, **config
    )
    for version in versions:
        if version != 1:
            write_version(model_dir, version)
    if 1 not in versions:
        for child in (model_dir / "1").iterdir():
            child.unlink()
        (model_dir / "1").rmdir()
    return model_dir


def write_admin_keys(directory: Path, *keys: str) -> Path:
    path = directory / "admin_keys"
    path.write_text("# admin keys for the repository API\n" + "".join(f"{key}\n" for key in keys))
    return path


# Fault injection: the instance named ``bad_instance`` (model_version_index) goes bad while the
# file ``marker`` exists, whatever its restarts, or (``after_calls: N``) once it has run N batches
# (probes included) since it was loaded: a restart loads it afresh, so it serves N more and goes
# bad again. Bad, it raises ("fail", a device error), blocks ("hang", 60 s or ``hang_s`` per call),
# or answers NaN ("nan"). Every other instance, and this one while good, answers INPUT + 1. Any
# instance refuses an input below -1e6 with a message meant for the client (ModelError: the input's
# fault, not the device's). A test creates the marker to break one instance under load and removes
# it to heal it.
FAULTY_MODEL = """
import os
import time

import numpy as np

from tensorgate import ModelError, PythonModel


class Faulty(PythonModel):
    def load(self, context):
        params = context.parameters
        self.bad = context.instance == params["bad_instance"]
        self.marker = params.get("marker")
        self.after_calls = int(params["after_calls"]) if "after_calls" in params else None
        self.calls = 0
        self.fault = params.get("fault", "fail")
        self.delay = float(params.get("delay_ms", 0)) / 1000.0
        self.hang_s = float(params.get("hang_s", 60))

    def broken(self):
        if self.marker is not None and os.path.exists(self.marker):
            return True
        return self.after_calls is not None and self.calls > self.after_calls

    def execute(self, inputs):
        x = inputs["INPUT"]
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if float(np.min(x, initial=0.0)) < -1e6:
            raise ModelError("model refuses inputs below -1e6")
        if self.bad and self.broken():
            if self.fault == "fail":
                raise RuntimeError("device error: the accelerator stopped answering")
            if self.fault == "hang":
                time.sleep(self.hang_s)
            if self.fault == "nan":
                return {"OUTPUT": np.full(x.shape, np.nan, dtype=np.float32)}
        return {"OUTPUT": (x + 1.0).astype(np.float32)}
"""


def write_faulty_model(
    repo: Path,
    name: str,
    marker: Path | None,
    *,
    fault: str = "fail",
    after_calls: int | None = None,
    count: int = 4,
    bad_index: int = 2,
    isolation: str = "thread",
    health_check: dict[str, Any] | None = None,
    delay_ms: float = 2.0,
    hang_s: float = 60.0,
    default_checks: bool = False,
) -> Path:
    """A FAULTY_MODEL model with ``count`` instances, instance ``bad_index`` the one that goes bad:
    while ``marker`` exists, and/or after ``after_calls`` batches of its own. Its health checks are
    quick ones for tests, or (``default_checks``) the server's defaults, untouched."""
    checks = {"interval_s": 0.2, "timeout_s": 0.5, "failure_threshold": 3, "batch_timeout_s": 1.0}
    parameters: dict[str, Any] = {
        "bad_instance": f"{name}_1_{bad_index}",
        "fault": fault,
        "delay_ms": delay_ms,
        "hang_s": hang_s,
    }
    if marker is not None:
        parameters["marker"] = str(marker)
    if after_calls is not None:
        parameters["after_calls"] = after_calls
    return write_python_model(
        repo,
        name,
        code=FAULTY_MODEL,
        parameters=parameters,
        instance_group=[{"count": count, "kind": "cpu", "isolation": isolation}],
        **({} if default_checks else {"health_check": {**checks, **(health_check or {})}}),
        dynamic_batching={"max_queue_delay_ms": 1},
    )


# Holds its weights in memory: ``weights.npy`` in its version directory (FP32, every element the
# model's ``value``), read at load, so a load grows the server's memory by the file's size. Adds
# the first weight to its input. While the file ``hold_file`` names exists, a batch waits for it
# to go (at most 30 s): a test keeps the model in use for as long as it needs.
WEIGHTS_MODEL = """
import os
import time

import numpy as np

from tensorgate import PythonModel


class Weights(PythonModel):
    def load(self, context):
        self.weights = np.load(context.directory / "weights.npy")
        self.hold = context.parameters.get("hold_file")
        self.delay = float(context.parameters.get("delay_ms", 0)) / 1000.0

    def execute(self, inputs):
        if self.delay:
            time.sleep(self.delay)
        if self.hold:
            end = time.monotonic() + 30.0
            while os.path.exists(self.hold) and time.monotonic() < end:
                time.sleep(0.005)
        return {"OUTPUT": (inputs["INPUT"] + self.weights[0]).astype(np.float32)}
"""


def write_weights_model(
    repo: Path,
    name: str,
    *,
    mib: float,
    value: float = 1.0,
    hold_file: Path | None = None,
    delay_ms: float = 0.0,
    **config: Any,
) -> Path:
    """A WEIGHTS_MODEL model holding ``mib`` MiB of weights: ``INPUT`` FP32 [-1, 4] -> INPUT + ``value``,
    after ``delay_ms`` of sleep."""
    import numpy as np

    parameters: dict[str, Any] = {} if hold_file is None else {"hold_file": str(hold_file)}
    if delay_ms:
        parameters["delay_ms"] = delay_ms
    model_dir = write_python_model(repo, name, code=WEIGHTS_MODEL, parameters=parameters, **config)
    count = max(1, int(mib * (1 << 20)) // 4)
    np.save(model_dir / "1" / "weights.npy", np.full(count, value, dtype=np.float32))
    return model_dir
