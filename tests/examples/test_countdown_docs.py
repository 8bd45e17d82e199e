"""The decoupled model docs/model-repository.md shows is the bundled ``countdown``, word for word,
so the page's curl (run by tests/e2e/test_http_readme.py) streams what the page says it does."""

from __future__ import annotations

import re
from pathlib import Path

from tensorgate.examples.build import COUNTDOWN_CONFIG, COUNTDOWN_MODEL

PAGE = Path(__file__).resolve().parents[2] / "docs" / "model-repository.md"


def test_the_documented_countdown_is_the_bundled_one() -> None:
    page = PAGE.read_text(encoding="utf-8")
    code = re.search(r"```python\n# models/countdown/1/model.py\n(.*?)```", page, re.S)
    config = re.search(r"```yaml\n# models/countdown/config.yaml\n(.*?)```", page, re.S)
    assert code is not None and config is not None
    assert code.group(1) == COUNTDOWN_MODEL
    assert config.group(1) == COUNTDOWN_CONFIG
