from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from llm_model_factory import build_model

# Two cores shared by the whole suite: keep torch from spawning a thread per core per worker.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding ``tiny`` (a random-weight Llama) as version 1."""
    repo = tmp_path_factory.mktemp("llm-repo")
    build_model(repo / "tiny" / "1")
    (repo / "tiny" / "config.yaml").write_text(
        "backend: llm\n"
        "llm:\n"
        "  max_num_seqs: 8\n"
        "  max_num_batched_tokens: 64\n"
        "  kv_cache_bytes: 4194304\n"
        "  max_model_len: 256\n"
        "  max_waiting: 64\n"
        "  threads: 1\n"
    )
    # The same model with one slot and a one-request queue, to show over-capacity answers.
    shutil.copytree(repo / "tiny" / "1", repo / "narrow" / "1")
    (repo / "narrow" / "config.yaml").write_text(
        "backend: llm\nllm:\n  max_num_seqs: 1\n  max_waiting: 1\n  max_model_len: 256\n  threads: 1\n"
    )
    return repo


@pytest.fixture(scope="session")
def tiny_dir(tiny_lm: Path) -> Path:
    return tiny_lm / "tiny" / "1"
