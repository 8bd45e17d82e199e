"""Text generation goes through the model's traffic split and canary like tensor requests.

OpenAI completions and the generate extension resolve their model through the service's one door,
so weights choose their version, a canary is judged by them, and a shadow (which compares tensors)
is refused for a generative model at load.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import yaml

from tensorgate.testing import ServerProcess


def _repo(tiny_lm: Path, tmp_path: Path, traffic: dict[str, object]) -> Path:
    """``tiny`` with two versions (the same weights) and ``traffic``."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_lm / "tiny" / "1", repo / "tiny" / "1")
    shutil.copytree(tiny_lm / "tiny" / "1", repo / "tiny" / "2")
    config = {
        "backend": "llm",
        "version_policy": {"all": True},
        "llm": {"max_num_seqs": 4, "kv_cache_bytes": 4194304, "max_model_len": 128, "threads": 1},
        "traffic": traffic,
    }
    (repo / "tiny" / "config.yaml").write_text(yaml.safe_dump(config))
    return repo


@pytest.mark.parametrize("weights", [{1: 100, 2: 0}, {1: 0, 2: 100}])
def test_generation_follows_the_weights(tiny_lm: Path, tmp_path: Path, weights: dict[int, int]) -> None:
    repo = _repo(tiny_lm, tmp_path, {"weights": weights})
    expected = "1" if weights[1] else "2"
    with ServerProcess("--model-repository", str(repo)) as server, httpx.Client(base_url=server.url) as client:
        for _ in range(4):
            answer = client.post("/v2/models/tiny/generate", json={"text_input": "hello", "max_tokens": 2})
            assert answer.status_code == 200, answer.text
            assert answer.json()["model_version"] == expected


def test_a_canary_judges_generations(tiny_lm: Path, tmp_path: Path) -> None:
    canary = {"version": 2, "stable": 1, "steps": [50, 100], "step_s": 600, "min_requests": 1000}
    repo = _repo(tiny_lm, tmp_path, {"canary": canary})
    with ServerProcess("--model-repository", str(repo)) as server, httpx.Client(base_url=server.url) as client:
        sent = 0
        for route, body in [
            ("/v2/models/tiny/generate", {"text_input": "hello", "max_tokens": 2}),
            ("/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 2}),
            ("/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 2, "stream": True}),
        ]:
            for _ in range(3):
                answer = client.post(route, json=body)
                assert answer.status_code == 200, answer.text
                sent += 1
        step = client.get("/v2/models/tiny/rollout").json()["rollout"]["current_step"]
    assert step["canary"]["requests"] + step["stable"]["requests"] == sent
    assert step["canary"]["errors"] == step["stable"]["errors"] == 0


def test_a_shadow_on_a_generative_model_is_refused_at_load(tiny_lm: Path, tmp_path: Path) -> None:
    repo = _repo(tiny_lm, tmp_path, {"shadow": {"version": 2, "fraction": 1.0}})
    with ServerProcess("--model-repository", str(repo), wait_ready=False) as server:
        server.wait_loaded()
        with httpx.Client(base_url=server.url) as client:
            answer = client.post("/v2/models/tiny/generate", json={"text_input": "hello", "max_tokens": 2})
    assert answer.status_code == 503
    assert "traffic.shadow is not for the llm backend" in answer.json()["error"]
