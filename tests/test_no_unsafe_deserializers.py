"""No deserializer that can run code touches request data or worker traffic (DESIGN §9, S-T6a).

A static gate over the package source: a pattern here is a decision someone must make on purpose.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tensorgate"
FORBIDDEN = re.compile(
    r"import pickle|from pickle|pickle\.loads?\(|cloudpickle|dill\.|joblib\.load|marshal\.loads|"
    r"allow_pickle\s*=\s*True|yaml\.load\(|yaml\.unsafe_load|torch\.load\(|(?<![.\w])eval\(|(?<![.\w])exec\("
)


def test_the_package_uses_no_code_running_deserializer() -> None:
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "generated" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#", 1)[0]
            if FORBIDDEN.search(code):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert hits == []


def test_the_gate_catches_what_it_is_for() -> None:
    for sample in ("pickle.loads(body)", "yaml.load(text)", "np.load(f, allow_pickle=True)", "torch.load(p)"):
        assert FORBIDDEN.search(sample), sample
    assert FORBIDDEN.search("eval(source)")
    assert not FORBIDDEN.search("yaml.safe_load(text)")
    assert not FORBIDDEN.search("model.eval()")  # torch's evaluation mode, not Python's eval
