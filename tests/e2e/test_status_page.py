"""The live status page against a real server: the JSON it polls (``/v2/status``),
its gate (the ``metrics`` role), and the page itself in a real browser (Debian's chromium driven by
Playwright): the figures it shows are the document's, they match ``/v2/status``, they follow the
traffic (requests/s above 0 under load, back to 0 after it stops, errors by code), two tenants are
each seen served while one floods (and is refused past its ``max_queued``), the page updates
every second, and screenshots are kept as test artifacts (``TENSORGATE_ARTIFACTS``, when set).

Every wait is on a selector (an event in the page) with a deadline, never a sleep; the selectors
need no ``eval``, so the page runs under its own Content-Security-Policy as a user's browser would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from model_builders import v2_body, write_python_model, write_versioned_model
from playwright.sync_api import Page, sync_playwright
from system_tools import system_tool
from tls_material import key_line

from tensorgate.testing import ServerProcess

OPS_KEY = "ops-key-0123456789abcdef"  # metrics, every model
OPS_ECHO_KEY = "ops-echo-key-0123456789ab"  # metrics, the echo model only
TEAM_KEY = "team-key-0123456789abcdef"  # infer only
BAD_BODY = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 3], "data": [0.0, 0.0, 0.0]}]}
RATE_SPAN_WAIT_MS = 30_000  # requests/s covers the last 10 s: back to 0 well within this


def _repository(root: Path) -> Path:
    repo = root / "models"
    write_python_model(repo, "echo", parameters={"delay_ms": 2}, dynamic_batching={"max_queue_delay_ms": 2})
    write_versioned_model(repo, "split", [1, 2], traffic={"weights": {1: 75, 2: 25}})
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("status")
    # The flooding tenant may hold one request in a model's queue: past it, it alone is refused.
    tenants = {"flood": {"max_queued": 1}}
    config = {"server": {"model_repository": str(_repository(directory)), "tenants": tenants}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    with ServerProcess("--config", str(directory / "config.yaml")) as process:
        yield process


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("status-auth")
    keys = directory / "api_keys"
    lines = [
        key_line(OPS_KEY, "ops", "metrics"),
        key_line(OPS_ECHO_KEY, "ops-echo", "metrics", "echo"),
        key_line(TEAM_KEY, "team", "infer"),
    ]
    keys.write_text("\n".join(lines) + "\n")
    config = {"server": {"model_repository": str(_repository(directory)), "auth": {"api_keys_file": str(keys)}}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    with ServerProcess("--config", str(directory / "config.yaml")) as process:
        yield process


def _status(server: ServerProcess, **headers: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/v2/status", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def _models(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {model["name"]: model for model in document["models"]}


# -- the JSON document and the routes, without a browser ------------------------------------------


def test_the_document_reports_states_shares_instances_and_the_last_minute(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/v2/status").json()["tenants"] is None  # no request named a tenant yet
        for _ in range(12):
            assert client.post("/v2/models/echo/infer", json=v2_body([[1.0, 2.0, 3.0, 4.0]])).status_code == 200
        assert client.post("/v2/models/echo/infer", json=BAD_BODY).status_code == 400
        for tenant, count in (("alpha", 3), ("beta", 1)):
            for _ in range(count):
                sent = client.post("/v2/models/split/infer", json=v2_body([[0.0] * 4]), headers={"x-tenant": tenant})
                assert sent.status_code == 200
        response = client.get("/v2/status")
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    document = response.json()
    server_part = document["server"]
    assert server_part["name"] == "tensorgate" and server_part["ready"] is True and server_part["live"] is True
    assert server_part["models"] == 2 and server_part["models_ready"] == 2
    assert server_part["window_s"] == 60 and server_part["rate_span_s"] == 10
    models = _models(document)
    assert set(models) == {"echo", "split"}
    echo = models["echo"]
    assert echo["state"] == "READY" and echo["backend"] == "python" and echo["generative"] is False
    (version,) = echo["versions"]
    assert version["state"] == "READY" and version["ready"] is True and version["share"] == 100.0
    assert [(i["health"], i["device"]) for i in version["instances"]] == [("ok", "cpu")]
    assert version["queue"]["queued"] == 0 and version["queue"]["max_queue_size"] > 0
    window = version["window"]
    assert window["outcomes"].get("success", 0) >= 12 and window["errors"].get("invalid", 0) >= 1
    assert window["requests_per_s"] > 0 and echo["requests_per_s"] == window["requests_per_s"]
    assert window["p50_ms"] > 0 and window["p99_ms"] >= window["p50_ms"]
    assert sum(window["batch_sizes"].values()) >= 12 and version["generation"] is None
    split = models["split"]
    assert split["traffic"]["shares"] == {"1": 75.0, "2": 25.0}
    assert [(v["version"], v["state"], v["share"]) for v in split["versions"]] == [
        ("1", "READY", 75.0),
        ("2", "READY", 25.0),
    ]
    tenants = document["tenants"]
    rows = {row["name"]: row for row in tenants["rows"]}
    assert tenants["others"] is None and set(rows) == {"alpha", "beta"}  # the shared tenant's came before
    assert [row["name"] for row in tenants["rows"]] == ["alpha", "beta"]  # busiest first
    assert (rows["alpha"]["answered"], rows["alpha"]["refused"], rows["alpha"]["errors"]) == (3, 0, 0)
    assert rows["beta"]["answered"] == 1 and rows["beta"]["requests_per_s"] > 0
    assert rows["alpha"]["p99_ms"] >= rows["alpha"]["p50_ms"] > 0
    later = _status(server)
    assert later["server"]["sequence"] > server_part["sequence"]  # a new document on every poll


def test_the_page_and_the_document_answer_get_and_head_only(server: ServerProcess) -> None:
    browser = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    with httpx.Client(base_url=server.url, timeout=10, headers=browser) as client:
        for path in ("/", "/status"):
            page = client.get(path)
            assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
            assert "<title>tensorgate status</title>" in page.text and "/v2/status" in page.text
            policy = page.headers["content-security-policy"]
            assert "default-src 'none'" in policy and "script-src 'sha256-" in policy and "unsafe" not in policy
            assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
            head = client.head(path)
            assert head.status_code == 200 and head.content == b""
        # Not a browser (curl, the KServe SDK's V1 client): the root is KServe V1's liveness answer.
        alive = client.get("/", headers={"accept": "*/*"})
        assert alive.status_code == 200 and alive.json() == {"status": "alive"}
        for path in ("/", "/status", "/v2/status"):
            wrong = client.post(path)
            assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD"
        assert client.get("/status/more").status_code == 404
        assert client.get("/v2/status/more").status_code == 404


def test_the_page_and_the_document_need_the_metrics_role(locked: ServerProcess) -> None:
    with httpx.Client(base_url=locked.url, timeout=10) as client:
        for path in ("/", "/status", "/v2/status"):
            missing = client.get(path)
            assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
            forbidden = client.get(path, headers={"authorization": f"Bearer {TEAM_KEY}"})
            assert forbidden.status_code == 403 and "'metrics' role" in forbidden.json()["error"]
            assert client.get(path, headers={"x-api-key": OPS_KEY}).status_code == 200
    assert set(_models(_status(locked, authorization=f"Bearer {OPS_KEY}"))) == {"echo", "split"}
    # Authenticated, the tenant is the caller: the team's requests are the team's, whatever header it sends.
    infer = {"authorization": f"Bearer {TEAM_KEY}", "x-tenant": "someone-else"}
    assert httpx.post(f"{locked.url}/v2/models/echo/infer", json=v2_body([[0.0] * 4]), headers=infer).status_code == 200
    everything = _status(locked, authorization=f"Bearer {OPS_KEY}")
    assert [row["name"] for row in everything["tenants"]["rows"]] == ["team"]
    limited = _status(locked, authorization=f"Bearer {OPS_ECHO_KEY}")  # sees only the models it may use
    assert set(_models(limited)) == {"echo"} and limited["server"]["models"] == 1
    assert limited["tenants"] is None  # tenants' figures span the models: not for a caller limited to some


# -- the page in a real browser --------------------------------------------------------------------


class Load:
    """Requests to ``echo`` from ``clients`` threads until stopped. Without a tenant: mostly good
    ones, one in eight invalid. As ``tenant``: good ones, ``pause_s`` apart in each thread, where a
    503 (the tenant's own queue bound) is counted as refused rather than as a failure."""

    def __init__(self, url: str, tenant: str | None = None, clients: int = 1, pause_s: float = 0.0) -> None:
        self._url = url
        self._tenant = tenant
        self._pause_s = pause_s
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        self._lock = threading.Lock()
        self.sent = 0
        self.refused = 0
        self.failures: list[str] = []

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _run(self) -> None:
        headers = {} if self._tenant is None else {"x-tenant": self._tenant}
        try:
            with httpx.Client(base_url=self._url, timeout=10, headers=headers) as client:
                while not self._stop.is_set():
                    with self._lock:
                        bad = self._tenant is None and self.sent % 8 == 7
                        self.sent += 1
                    response = client.post("/v2/models/echo/infer", json=BAD_BODY if bad else v2_body([[0.0] * 4]))
                    if self._tenant is not None and response.status_code == 503 and "retry-after" in response.headers:
                        with self._lock:
                            self.refused += 1
                    elif response.status_code != (400 if bad else 200):
                        self.failures.append(f"{response.status_code}: {response.text[:200]}")
                    self._stop.wait(self._pause_s)  # a steady client's pace, not a wait for the server
        except Exception as exc:  # a thread must not raise: the test reads what went wrong
            self.failures.append(repr(exc))


# Read in one call, so the figures and the document they came from are of the same render.
_READ_PAGE = """() => {
  const doc = window.tensorgateStatus;
  const value = (root, selector) => {
    const el = root.querySelector(selector);
    return el === null ? null : el.dataset.value;
  };
  const models = {};
  for (const card of document.querySelectorAll("section[data-model]")) {
    const versions = {};
    for (const row of card.querySelectorAll("tr[data-version]")) {
      versions[row.dataset.version] = {
        state: value(row, '[data-field="state"]'), share: value(row, '[data-field="share"]'),
        rps: value(row, '[data-field="rps"]'), p50: value(row, '[data-field="p50"]'),
        p99: value(row, '[data-field="p99"]'), errors: value(row, '[data-field="errors"]'),
        instances: value(row, '[data-field="instances"]'),
      };
    }
    models[card.dataset.model] = {
      state: value(card, '.title [data-field="state"]'), rps: value(card, '.stats [data-field="rps"]'),
      errors: value(card, '.stats [data-field="errors"]'), versions,
      codes: Object.fromEntries(
        [...card.querySelectorAll(".chip[data-code]")].map((chip) => [chip.dataset.code, chip.textContent])),
    };
  }
  const tenants = {};
  for (const row of document.querySelectorAll("#tenants tr[data-tenant], #tenants tr[data-others]")) {
    tenants[row.dataset.tenant === undefined ? "*others*" : row.dataset.tenant] = {
      rps: value(row, '[data-field="rps"]'), answered: value(row, '[data-field="answered"]'),
      refused: value(row, '[data-field="refused"]'), deadlineRefused: value(row, '[data-field="deadline-refused"]'),
      errors: value(row, '[data-field="errors"]'), p50: value(row, '[data-field="p50"]'),
      p99: value(row, '[data-field="p99"]'), share: value(row, '[data-field="share"]'),
    };
  }
  return {
    doc, models, tenants, sequence: document.body.dataset.sequence,
    tenantsShown: !document.getElementById("tenants").hidden,
    serverState: document.getElementById("server-state").dataset.value,
    totalRps: document.getElementById("total-rps").dataset.value,
  };
}"""


def _number(text: str | None) -> float | None:
    return None if text in (None, "") else float(text)


def _check_the_page_shows_its_document(shown: dict[str, Any]) -> None:
    doc = shown["doc"]
    assert shown["sequence"] == str(doc["server"]["sequence"])
    assert shown["serverState"] == ("READY" if doc["server"]["ready"] else "NOT_READY")
    assert _number(shown["totalRps"]) == doc["server"]["requests_per_s"]
    assert set(shown["models"]) == {m["name"] for m in doc["models"]}
    for model in doc["models"]:
        card = shown["models"][model["name"]]
        assert card["state"] == model["state"] and _number(card["rps"]) == model["requests_per_s"]
        assert set(card["versions"]) == {v["version"] for v in model["versions"]}
        for version in model["versions"]:
            row, window = card["versions"][version["version"]], version["window"]
            assert row["state"] == version["state"] and _number(row["share"]) == version["share"]
            assert _number(row["instances"]) == len(version["instances"])
            assert _number(row["rps"]) == window["requests_per_s"]
            assert _number(row["p50"]) == window["p50_ms"] and _number(row["p99"]) == window["p99_ms"]
            assert _number(row["errors"]) == sum(window["errors"].values())
    tenants = doc["tenants"]
    assert shown["tenantsShown"] == (tenants is not None)
    if tenants is None:
        return
    listed = [*tenants["rows"], *([tenants["others"]] if tenants["others"] else [])]
    assert set(shown["tenants"]) == {"*others*" if t["name"] is None else t["name"] for t in listed}
    for tenant in listed:
        row = shown["tenants"]["*others*" if tenant["name"] is None else tenant["name"]]
        assert _number(row["rps"]) == tenant["requests_per_s"]
        assert _number(row["answered"]) == tenant["answered"] and _number(row["refused"]) == tenant["refused"]
        assert _number(row["deadlineRefused"]) == tenant["deadline_refused"]
        assert _number(row["errors"]) == tenant["errors"]
        assert _number(row["p50"]) == tenant["p50_ms"] and _number(row["p99"]) == tenant["p99_ms"]


def _save(page: Page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    artifacts = os.environ.get("TENSORGATE_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / name)
    return path


@pytest.fixture(scope="module")
def chromium() -> str:
    return system_tool("chromium")


@contextlib.contextmanager
def _browser_page(chromium: str) -> Iterator[tuple[Page, list[str]]]:
    """A page in headless chromium, and the errors its script reports (the test asserts none)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            problems: list[str] = []
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            yield page, problems
        finally:
            browser.close()


def test_the_page_in_a_browser_follows_the_traffic(server: ServerProcess, chromium: str, tmp_path: Path) -> None:
    echo = 'section[data-model="echo"]'
    with _browser_page(chromium) as (page, problems):
        with Load(server.url) as load:
            page.goto(f"{server.url}/status")
            # Under load: requests/s above 0 and the invalid requests counted by their code.
            page.wait_for_selector(f'{echo} .stats [data-field="rps"]:not([data-value="0"])', state="attached")
            page.wait_for_selector(f'{echo} .chip[data-code="invalid"]', state="attached")
            shown = page.evaluate(_READ_PAGE)
            direct = _status(server)
            sequence = page.get_attribute("body", "data-sequence")
            page.wait_for_selector(f'body:not([data-sequence="{sequence}"])', state="attached")  # it updates
            _save(page, tmp_path, "status-page-under-load.png")
        assert not load.failures, load.failures[:3]
        assert load.sent > 0
        _check_the_page_shows_its_document(shown)
        mine, theirs = _models(shown["doc"]), _models(direct)
        assert set(mine) == set(theirs) == {"echo", "split"}
        for name in mine:  # what changes only with the configuration is the same in both
            assert mine[name]["state"] == theirs[name]["state"] == "READY"
            assert [(v["version"], v["state"], v["share"]) for v in mine[name]["versions"]] == [
                (v["version"], v["state"], v["share"]) for v in theirs[name]["versions"]
            ]
        assert mine["echo"]["requests_per_s"] > 0 and theirs["echo"]["requests_per_s"] > 0
        assert shown["models"]["echo"]["codes"]["invalid"].startswith("invalid ")
        assert float(shown["models"]["echo"]["errors"]) > 0
        # The traffic stopped: requests/s falls back to 0 on the page and in the document.
        page.wait_for_selector(
            f'{echo} .stats [data-field="rps"][data-value="0"]', state="attached", timeout=RATE_SPAN_WAIT_MS
        )
        page.wait_for_selector('#total-rps[data-value="0"]', state="attached", timeout=RATE_SPAN_WAIT_MS)
        quiet = page.evaluate(_READ_PAGE)
        _check_the_page_shows_its_document(quiet)
        assert _models(_status(server))["echo"]["requests_per_s"] == 0.0
        assert int(quiet["sequence"]) > int(shown["sequence"])
        _save(page, tmp_path, "status-page-after-load.png")
        assert not problems, problems


def test_the_page_shows_each_tenant_served_while_one_floods(
    server: ServerProcess, chromium: str, tmp_path: Path
) -> None:
    """The issue's "done means": two tenants, one sending as fast as four clients can, the other a
    request every 20 ms; the page shows both served, and the flood alone refused past its bound."""
    rows = "#tenants tr[data-tenant"
    with _browser_page(chromium) as (page, problems):
        with Load(server.url, "flood", clients=4) as flood, Load(server.url, "steady", pause_s=0.02) as steady:
            page.goto(f"{server.url}/status")
            for tenant in ("flood", "steady"):
                page.wait_for_selector(
                    f'{rows}="{tenant}"] [data-field="answered"]:not([data-value="0"])', state="attached"
                )
            page.wait_for_selector(f'{rows}="flood"] [data-field="refused"]:not([data-value="0"])', state="attached")
            shown = page.evaluate(_READ_PAGE)
            _save(page, tmp_path, "status-page-tenants.png")
        assert not flood.failures and not steady.failures, (flood.failures[:3], steady.failures[:3])
        assert flood.refused > 0 and steady.refused == 0
        _check_the_page_shows_its_document(shown)
        flooding, steadily = shown["tenants"]["flood"], shown["tenants"]["steady"]
        assert _number(flooding["rps"]) > 0 and _number(steadily["rps"]) > 0  # both served
        assert _number(flooding["refused"]) > 0 and _number(steadily["refused"]) == 0
        assert _number(steadily["errors"]) == 0 and _number(steadily["p99"]) is not None
        assert 0 < _number(steadily["share"]) < _number(flooding["share"])  # type: ignore[operator]
        assert not problems, problems
