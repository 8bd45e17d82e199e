"""The README's walk-through of hot reload, as a user runs it: the bundled ``mlp`` written to a
repository of one's own (``tensorgate examples``), served in poll mode, version 2 copied in while
``tensorgate bench`` runs (no error in its report, answers move to v2), then a 90/10 split seen in
the metrics, then a canary that promotes itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import yaml
from model_builders import metric, wait_until

from tensorgate.examples import EXAMPLE_MODELS
from tensorgate.testing import ServerProcess


def _write_config(model_dir: Path, change: dict[str, object]) -> None:
    document = yaml.safe_load((model_dir / "config.yaml").read_text())
    document.update(change)
    staged = model_dir / ".config.yaml.new"
    staged.write_text(yaml.safe_dump(document))
    staged.replace(model_dir / "config.yaml")


def _versions(url: str, n: int) -> dict[str, int]:
    body = {"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}]}
    seen: dict[str, int] = {}
    with httpx.Client(timeout=10.0) as client:
        for _ in range(n):
            version = client.post(f"{url}/v2/models/mlp/infer", json=body).json()["model_version"]
            seen[version] = seen.get(version, 0) + 1
    return seen


def test_copy_v2_in_under_bench_then_split_then_canary(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    subprocess.run([sys.executable, "-m", "tensorgate", "examples", str(repo)], check=True, capture_output=True)
    mlp = repo / "mlp"
    args = ("--model-repository", str(repo), "--model-control", "poll", "--repository-poll-secs", "0.5")
    with ServerProcess(*args, "--no-access-log") as server:
        report = tmp_path / "bench.json"
        command = [sys.executable, "-m", "tensorgate", "bench", "-m", "mlp", "-u", server.url]
        bench = subprocess.Popen(
            [*command, "-c", "8", "-z", "8s", "--json", str(report)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: metric(server.metrics_url, "tensorgate_requests_total", model="mlp") > 200)
            shutil.copytree(mlp / "1", tmp_path / "staged")
            (tmp_path / "staged").rename(mlp / "2")  # copied in while the bench runs
            wait_until(lambda: _versions(server.url, 1) == {"2": 1}, timeout_s=30)
            assert bench.wait(60) == 0
        finally:
            if bench.poll() is None:
                bench.kill()
                bench.wait()
        [run] = json.loads(report.read_text())["runs"]
        assert run["requests"] > 0 and run["errors"] == {}
        served = {v: metric(server.metrics_url, "tensorgate_requests_total", model="mlp", version=v) for v in "12"}
        assert served["1"] > 0 and served["2"] > 0

        _write_config(mlp, {"traffic": {"weights": {1: 90, 2: 10}}})  # v1 comes back for its 90 %
        wait_until(lambda: metric(server.metrics_url, "tensorgate_traffic_share", model="mlp", version="2") == 10)
        wait_until(lambda: httpx.get(f"{server.url}/v2/models/mlp/versions/1/ready").status_code == 200)
        seen = _versions(server.url, 400)
        assert 20 <= seen.get("2", 0) <= 70 and seen["1"] + seen["2"] == 400

        canary = {"version": 2, "steps": [50, 100], "step_s": 0.2, "min_requests": 20, "max_p99_ratio": 50}
        _write_config(mlp, {"traffic": {"canary": canary}})
        wait_until(lambda: httpx.get(f"{server.url}/v2/models/mlp/rollout").json()["rollout"] is not None)
        for _ in range(40):
            _versions(server.url, 25)
            if httpx.get(f"{server.url}/v2/models/mlp/rollout").json()["rollout"]["state"] != "stepping":
                break
        assert httpx.get(f"{server.url}/v2/models/mlp/rollout").json()["rollout"]["state"] == "promoted"
        assert _versions(server.url, 20) == {"2": 20}


def test_examples_are_written_once_and_never_over_a_model_already_there(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tensorgate", "examples", str(tmp_path / "models")]
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert {p.name for p in (tmp_path / "models").iterdir()} == EXAMPLE_MODELS
    (tmp_path / "models" / "mlp" / "config.yaml").write_text("max_batch_size: 2\n")  # a user's edit
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 1 and "already holds" in again.stderr
    assert (tmp_path / "models" / "mlp" / "config.yaml").read_text() == "max_batch_size: 2\n"
