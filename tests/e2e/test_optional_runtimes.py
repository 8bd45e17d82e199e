"""A missing optional package fails only the models that need it.

The server runs in an environment without torch and transformers: a ``sitecustomize`` on its
PYTHONPATH makes importing them raise ``ModuleNotFoundError`` exactly as an install without the
``llm`` extra does, in the server and in every process it starts.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from model_builders import v2_body, write_python_model

from tensorgate.testing import ServerProcess

ABSENT = '''
import sys

ABSENT = {"torch", "transformers", "tokenizers", "safetensors"}


class _NotInstalled:
    """Finds nothing under these names, as Python's own finders do for a package that is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


def test_a_model_needing_torch_fails_alone_with_the_extra_to_install(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(ABSENT)
    repo = tmp_path / "models"
    write_python_model(repo, "plain", parameters={"delay_ms": 0})
    (repo / "chat" / "1").mkdir(parents=True)
    (repo / "chat" / "config.yaml").write_text("backend: llm\n")
    (repo / "chat" / "1" / "config.json").write_text("{}")
    server = ServerProcess("--model-repository", str(repo), wait_ready=False, env={"PYTHONPATH": str(site)})
    with server:
        server.wait_loaded()
        assert server.process is not None and server.process.poll() is None  # still serving
        with httpx.Client(base_url=server.url, timeout=10.0) as client:
            assert client.post("/v2/models/plain/infer", json=v2_body([[1, 2, 3, 4]])).status_code == 200
            prompt = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}]}
            answer = client.post("/v2/models/chat/infer", json=prompt)
            assert answer.status_code == 503
            assert "pip install 'tensorgate[llm]'" in answer.json()["error"]
            assert "torch" in answer.json()["error"]
            assert client.get("/v2/models/chat/ready").status_code == 400
            assert client.get("/v2/health/live").status_code == 200
        logged = [r for r in server.log_records() if r.get("level") == "error"]
        assert any("tensorgate[llm]" in str(r.get("message")) for r in logged)
        assert not any("Traceback" in str(r) for r in server.log_records())
