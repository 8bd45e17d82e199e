"""End to end: ``tensorgate serve`` over a repository with the tiny LM, driven by real clients."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def server(tiny_lm: Path) -> Iterator[ServerProcess]:
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with ServerProcess("--model-repository", str(tiny_lm), "--log-level", "info", env=env, ready_timeout_s=90) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    yield c
    c.close()


def reference_text(tiny_dir: Path, prompt: str, max_tokens: int) -> str:
    tok = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True, use_safetensors=True).eval()
    ids = tok.encode(prompt)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False)
    return str(tok.decode(out[0, len(ids) :], skip_special_tokens=True))


def test_models_and_metadata(client: openai.OpenAI, server: ServerProcess) -> None:
    assert sorted(m.id for m in client.models.list()) == ["narrow", "tiny"]
    meta = httpx.get(server.url + "/v2/models/tiny").json()
    assert meta["inputs"][0]["name"] == "text_input" and meta["inputs"][0]["datatype"] == "BYTES"
    assert meta["outputs"][0]["name"] == "text_output"
    assert httpx.get(server.url + "/v2/models/tiny/ready").status_code == 200


def test_completion_greedy_matches_transformers(client: openai.OpenAI, tiny_dir: Path) -> None:
    prompt = "hello world the cat"
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
    assert got.choices[0].text == reference_text(tiny_dir, prompt, 12)
    assert got.usage is not None and got.usage.prompt_tokens == 4
    assert got.usage.completion_tokens == got.usage.total_tokens - 4 > 0


def test_completion_n_seed_logprobs(client: openai.OpenAI) -> None:
    got = client.completions.create(
        model="tiny", prompt="red green", max_tokens=6, temperature=1.0, seed=3, n=2, logprobs=2
    )
    assert len(got.choices) == 2
    again = client.completions.create(
        model="tiny", prompt="red green", max_tokens=6, temperature=1.0, seed=3, n=2, logprobs=2
    )
    assert [c.text for c in got.choices] == [c.text for c in again.choices]
    lp = got.choices[0].logprobs
    assert lp is not None and lp.token_logprobs and all(x <= 0 for x in lp.token_logprobs)


def test_streaming_completion(client: openai.OpenAI, tiny_dir: Path) -> None:
    prompt = "blue river stone"
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reference_text(tiny_dir, prompt, 10)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_and_streaming_chat(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert got.choices[0].message.role == "assistant"
    assert got.usage is not None and got.usage.completion_tokens <= 8
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == got.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == got.usage.completion_tokens


def test_generate_extension(server: ServerProcess, tiny_dir: Path) -> None:
    body = {"text_input": "one two three", "parameters": {"max_tokens": 8, "temperature": 0}}
    got = httpx.post(server.url + "/v2/models/tiny/generate", json=body, timeout=30)
    assert got.status_code == 200, got.text
    document = got.json()
    assert document["model_name"] == "tiny"
    assert document["text_output"] == reference_text(tiny_dir, "one two three", 8)
    with httpx.stream("POST", server.url + "/v2/models/tiny/versions/1/generate_stream", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [orjson.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["text_output"] for e in events) == document["text_output"]
    assert events[-1]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", {"model": "nope", "prompt": "a"}, 404),
        ("/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": -1}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": 5}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": "a", "temperature": "hot"}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": "the " * 300, "max_tokens": 4}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 10_000}, 400),
        ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400),
        ("/v2/models/nope/generate", {"text_input": "a"}, 404),
        ("/v2/models/tiny/generate", {"text_input": 7}, 400),
        ("/v2/models/tiny/generate", {"text_input": "a", "parameters": {"max_tokens": -3}}, 400),
    ],
)
def test_bad_input(server: ServerProcess, path: str, body: dict[str, object], status: int) -> None:
    got = httpx.post(server.url + path, json=body, timeout=30)
    assert got.status_code == status, got.text
    assert "error" in got.json()


def test_not_json_and_wrong_method(server: ServerProcess) -> None:
    got = httpx.post(server.url + "/v1/completions", content=b"{nope", timeout=30)
    assert got.status_code == 400
    assert httpx.get(server.url + "/v1/completions", timeout=30).status_code == 405


def test_metrics_are_exported(server: ServerProcess, client: openai.OpenAI) -> None:
    client.completions.create(model="tiny", prompt="a b", max_tokens=2)
    text = httpx.get(server.metrics_url, timeout=30).text
    for name in (
        "tensorgate_time_to_first_token_seconds",
        "tensorgate_time_per_output_token_seconds",
        "tensorgate_generation_duration_seconds",
        "tensorgate_running_sequences",
        "tensorgate_waiting_sequences",
        "tensorgate_kv_cache_usage_ratio",
        "tensorgate_preemptions_total",
        "tensorgate_prompt_tokens_total",
        "tensorgate_generation_tokens_total",
    ):
        assert f"{name}" in text and 'model="tiny"' in text, name


def _metric(server: ServerProcess, name: str, model: str = "tiny") -> float:
    for line in httpx.get(server.metrics_url, timeout=30).text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_disconnect_cancels_streaming_generation(server: ServerProcess) -> None:
    before = _metric(server, "tensorgate_generation_tokens_total")
    body = {"model": "tiny", "prompt": "a b c", "max_tokens": 240, "n": 4, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
    # The client is gone: its four sequences leave the running set without finishing.
    deadline = time.monotonic() + 20
    while _metric(server, "tensorgate_running_sequences") > 0:
        assert time.monotonic() < deadline, "the cancelled sequences kept running"
        time.sleep(0.05)
    assert _metric(server, "tensorgate_generation_tokens_total") - before < 4 * 240


def test_over_capacity_is_503_with_retry_after(server: ServerProcess) -> None:
    # "narrow" queues one request: the second of two choices, admitted in the same turn, does not fit.
    body = {"model": "narrow", "prompt": "a b c", "max_tokens": 4, "n": 2}
    refused = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert refused.status_code == 503
    assert int(refused.headers["retry-after"]) >= 1
    assert "queue is full" in refused.json()["error"]
    # The refused request left nothing behind: a request that fits is served.
    assert httpx.post(server.url + "/v1/completions", json={**body, "n": 1}, timeout=30).status_code == 200


def test_v2_infer_on_a_language_model(server: ServerProcess, tiny_dir: Path) -> None:
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2, 1], "data": ["hello world", "red"]}]}
    got = httpx.post(server.url + "/v2/models/tiny/infer", json=body, timeout=30)
    assert got.status_code == 200, got.text
    output = got.json()["outputs"][0]
    assert output["name"] == "text_output" and output["datatype"] == "BYTES" and output["shape"] == [2, 1]
    # Each row is one greedy generation of llm.default_max_tokens (16) tokens.
    assert output["data"] == [reference_text(tiny_dir, "hello world", 16), reference_text(tiny_dir, "red", 16)]
