"""The shipped nginx configuration in front of three real replicas: a replica killed, stopped, or gone bad.

``deploy/nginx/tensorgate.conf`` is the file under test: each test renders it with only the
addresses, ports and log paths replaced, includes it in a minimal nginx.conf of its own (pid, temp
paths, ``events``), and runs Debian's nginx on loopback ports. Three ``tensorgate serve`` processes
serve a Python model with a known delay; 16 client threads keep a steady closed-loop load through
nginx, over HTTP or gRPC, and every answer is recorded with the request id that nginx's access log
joins to the replica that served it.

- Killed: ``kill -9`` one replica while a batch runs on it: zero non-2xx over HTTP. Over gRPC, nginx
  cannot send again a call already on the killed replica (it streams gRPC unbuffered), so those
  calls fail UNAVAILABLE: each one must have been in flight on that replica at the kill; all other
  calls succeed.
- Stopped: SIGTERM one replica (its drain): zero failures over HTTP and gRPC.
- Gone bad: a replica whose only instance goes bad (it hangs) leaves nginx's rotation: its stuck batch
  is failed at the model's batch timeout and answered 503 (nginx sends it elsewhere), the health
  checks take the instance out, the replica turns not ready; zero non-2xx at the clients over HTTP.
  Over gRPC the replica refuses connections once not ready (``--grpc-refuse-when-unready``, as the
  docs run replicas behind nginx), so nginx sends later calls elsewhere; the calls it already held
  (its stuck batch and its queue) fail UNAVAILABLE, as kill -9's do, and no other call does.
- Control: the same kill without ``non_idempotent`` (the one change): the requests in flight on
  the killed replica come back 502, which is why the shipped file has it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from model_builders import wait_until, write_faulty_model, write_python_model
from system_tools import system_tool
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tensorgate.config.server_config import DEFAULT_MAX_BODY_BYTES, ServerSection
from tensorgate.testing import ServerProcess

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "tensorgate.conf"
REPLICAS = 3
CLIENTS = 16
MODEL = "delay"
WIDTH = 4
DELAY_MS = 20  # per batch: ~5 requests in flight on each replica under 16 clients, little CPU
DRAIN_S = 1.0
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 10.0


# -- the configuration under test -------------------------------------------------------------------


def shipped_text() -> str:
    return SHIPPED.read_text()


def _upstream_block(text: str, name: str) -> re.Match[str]:
    match = re.search(rf"^upstream {name} \{{\n(.*?)^\}}", text, re.S | re.M)
    assert match is not None, f"no upstream {name} in {SHIPPED}"
    return match


def render(
    text: str,
    *,
    http_listen: str,
    grpc_listen: str,
    http_replicas: list[str],
    grpc_replicas: list[str],
    log_dir: Path,
) -> str:
    """The shipped file with the replicas' addresses, the listen addresses and the log directory
    replaced, and nothing else: every substitution must find exactly what it expects."""
    for name, addresses in (("tensorgate_http", http_replicas), ("tensorgate_grpc", grpc_replicas)):
        block = _upstream_block(text, name)
        lines = re.findall(r"^(\s*server )(\S+)( .*)$", block.group(1), re.M)
        assert len(lines) == len(addresses), f"{name}: {len(lines)} server lines for {len(addresses)} replicas"
        body = block.group(1)
        for (prefix, shipped_address, rest), address in zip(lines, addresses, strict=True):
            body = body.replace(f"{prefix}{shipped_address}{rest}", f"{prefix}{address}{rest}", 1)
        text = text[: block.start(1)] + body + text[block.end(1) :]
    listens = {"listen 8080;": f"listen {http_listen};", "listen 8081 http2;": f"listen {grpc_listen} http2;"}
    for shipped_listen, listen in listens.items():
        assert text.count(shipped_listen) == 1, f"expected one `{shipped_listen}` in {SHIPPED}"
        text = text.replace(shipped_listen, listen)
    assert "/var/log/nginx/" in text
    return text.replace("/var/log/nginx/", f"{log_dir}/")


def without_non_idempotent(text: str) -> str:
    """The control: the shipped file less `non_idempotent` on the inference POSTs."""
    assert "non_idempotent" in text
    return text.replace(" non_idempotent;", ";")


# -- nginx ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_ENTRY = re.compile(
    r'^\S+ \[\S+\] "(?P<request>[^"]*)" (?P<status>\d+) \d+ rt=\S+ upstream=(?P<upstream>.*?) '
    r"ustatus=(?P<ustatus>.*?) urt=.*? grpc=(?P<grpc>\S*) rid=(?P<rid>\S+)$"
)


@dataclass(frozen=True)
class Entry:
    """One line of nginx's access log, in the shipped ``tensorgate`` format."""

    request: str
    status: int
    tried: tuple[str, ...]  # the replicas nginx tried, in order ($upstream_addr)
    upstream_statuses: tuple[str, ...]
    grpc_status: str
    rid: str

    @property
    def served_by(self) -> str:
        return self.tried[-1] if self.tried else ""


class Nginx:
    """Debian's nginx as a non-daemon child on loopback ports, with everything under ``root``."""

    def __init__(self, binary: str, root: Path, replicas: list[ServerProcess], transform: Callable[[str], str]) -> None:
        self.binary = binary
        self.root = root
        self.replicas = replicas
        self.transform = transform
        self.process: subprocess.Popen[bytes] | None = None
        self.http_port = 0
        self.grpc_port = 0
        self.logs = root / "logs"
        self.conf = root / "nginx.conf"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _write_config(self) -> None:
        for directory in ("logs", "temp"):
            (self.root / directory).mkdir(exist_ok=True)
        site = render(
            self.transform(shipped_text()),
            http_listen=f"127.0.0.1:{self.http_port}",
            grpc_listen=f"127.0.0.1:{self.grpc_port}",
            http_replicas=[r.http_address for r in self.replicas],
            grpc_replicas=[r.grpc_address for r in self.replicas],
            log_dir=self.logs,
        )
        (self.root / "tensorgate.conf").write_text(site)
        temp = self.root / "temp"
        user = "user root;" if os.geteuid() == 0 else ""  # workers must reach tmp_path (mode 0700)
        self.conf.write_text(
            f"""daemon off;
master_process on;
worker_processes 1;
{user}
pid {self.root}/nginx.pid;
error_log {self.logs}/main.error.log notice;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    include {self.root}/tensorgate.conf;
}}
"""
        )

    def _command(self, *extra: str) -> list[str]:
        return [
            self.binary,
            "-p",
            str(self.root),
            "-c",
            str(self.conf),
            "-e",
            str(self.logs / "main.error.log"),
            *extra,
        ]

    def check(self) -> None:
        """``nginx -t`` on the rendered configuration."""
        self._write_config()
        done = subprocess.run(self._command("-t"), capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr

    def start(self) -> Nginx:
        for _ in range(5):  # a free port can be taken by another test between finding and binding it
            self.http_port, self.grpc_port = free_port(), free_port()
            self.check()
            self.process = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            if self._wait_listening():
                return self
            self.stop()
            if "Address already in use" not in self.error_log():
                raise RuntimeError(f"nginx did not start:\n{self.error_log()}")
        raise RuntimeError(f"nginx found no free ports:\n{self.error_log()}")

    def _wait_listening(self) -> bool:
        deadline = time.monotonic() + 10.0
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                for port in (self.http_port, self.grpc_port):
                    socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                return True
            except OSError:
                time.sleep(0.02)
        raise TimeoutError(f"nginx not listening within 10 s:\n{self.error_log()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def error_log(self) -> str:
        text = ""
        for path in sorted(self.logs.glob("*.error.log")):
            text += path.read_text(errors="replace")[-6000:]
        return text

    def entries(self) -> list[Entry]:
        path = self.logs / "tensorgate.access.log"
        if not path.exists():
            return []
        out = []
        for line in path.read_text(errors="replace").splitlines():
            match = _ENTRY.match(line)
            assert match is not None, f"access log line not in the shipped format: {line!r}"
            upstream = match["upstream"]
            out.append(
                Entry(
                    request=match["request"],
                    status=int(match["status"]),
                    tried=tuple(a for a in re.split(r", | : ", upstream) if a != "-"),
                    upstream_statuses=tuple(re.split(r", | : ", match["ustatus"])),
                    grpc_status=match["grpc"],
                    rid=match["rid"],
                )
            )
        return out


# -- replicas -------------------------------------------------------------------------------------


@dataclass
class Fleet:
    """Three replicas and their nginx; addresses map back to replicas for per-replica counts."""

    replicas: list[ServerProcess]
    nginx: Nginx
    running_dir: Path

    def index(self, address: str) -> int:
        for i, replica in enumerate(self.replicas):
            if address in (replica.http_address, replica.grpc_address):
                return i
        raise KeyError(address)

    def served_by(self, entries: list[Entry]) -> Counter[int]:
        """Answers per replica (the last one nginx tried), from the access log."""
        return Counter(self.index(e.served_by) for e in entries if e.served_by)

    def batch_running(self, i: int) -> bool:
        """Whether replica ``i`` is inside its model's execute (the model marks it by pid)."""
        process = self.replicas[i].process
        return process is not None and (self.running_dir / str(process.pid)).exists()


def build_repository(root: Path) -> Path:
    running = root / "running"
    running.mkdir(parents=True)
    write_python_model(
        root / "models",
        MODEL,
        width=WIDTH,
        max_batch_size=8,
        parameters={"delay_ms": DELAY_MS, "running_dir": str(running)},
        dynamic_batching={"max_queue_delay_ms": 1.0},
    )
    return root / "models"


@pytest.fixture(scope="session")
def nginx_binary() -> str:
    return system_tool("nginx")


def start_fleet(
    tmp_path: Path,
    binary: str,
    transform: Callable[[str], str] = lambda text: text,
    repositories: Callable[[int], Path] | None = None,
) -> Fleet:
    """``repositories(i)``: replica i's own repository (default: one shared repository)."""
    shared = build_repository(tmp_path / "repo")
    replicas = [
        ServerProcess(
            "--model-repository",
            str(repositories(i) if repositories is not None else shared),
            "--replica-id",
            f"r{i}",
            "--drain-delay",
            str(DRAIN_S),
            "--grpc-refuse-when-unready",
            "--log-level",
            "warning",
            ready_timeout_s=START_TIMEOUT_S,
        )
        for i in range(REPLICAS)
    ]
    try:
        with ThreadPoolExecutor(REPLICAS) as pool:  # in parallel: each spends ~1 s importing
            list(pool.map(ServerProcess.start, replicas))
        (tmp_path / "nginx").mkdir()
        nginx = Nginx(binary, tmp_path / "nginx", replicas, transform).start()
    except BaseException:
        for replica in replicas:
            replica.__exit__(None, None, None)
        raise
    return Fleet(replicas, nginx, tmp_path / "repo" / "running")


def stop_fleet(fleet: Fleet) -> None:
    fleet.nginx.stop()
    for replica in fleet.replicas:  # all drain at once, rather than one drain delay after another
        if replica.process is not None and replica.process.poll() is None:
            replica.signal(signal.SIGTERM)
    for replica in fleet.replicas:
        replica.__exit__(None, None, None)


@pytest.fixture()
def fleet(tmp_path: Path, nginx_binary: str) -> Iterator[Fleet]:
    started = start_fleet(tmp_path, nginx_binary)
    yield started
    stop_fleet(started)


@pytest.fixture()
def control_fleet(tmp_path: Path, nginx_binary: str) -> Iterator[Fleet]:
    started = start_fleet(tmp_path, nginx_binary, without_non_idempotent)
    yield started
    stop_fleet(started)


# -- load -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    rid: str
    started: float  # monotonic, at the client
    ended: float
    outcome: str  # "ok", an HTTP status, a gRPC status code name, or a transport error
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass
class Load:
    """``clients`` threads in a closed loop through nginx, each call recorded (bounded in time by
    ``max_s`` and in count by ``max_calls`` per client, whichever comes first)."""

    protocol: str  # "http" or "grpc"
    target: str
    clients: int = CLIENTS
    max_s: float = 30.0
    max_calls: int = 5000
    calls: list[Call] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Load:
        for client in range(self.clients):
            thread = threading.Thread(target=self._run, args=(client,), name=f"load-{client}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(CALL_TIMEOUT_S + 5.0)
        assert not any(t.is_alive() for t in self._threads), "a load client did not stop"

    def ok_count(self) -> int:
        with self._lock:
            return sum(c.ok for c in self.calls)

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def _run(self, client: int) -> None:
        deadline = time.monotonic() + self.max_s
        send = self._http_sender() if self.protocol == "http" else self._grpc_sender()
        try:
            for seq in range(self.max_calls):
                if self._stop.is_set() or time.monotonic() > deadline:
                    break
                rid = f"c{client}-{seq}"
                values = np.arange(WIDTH, dtype=np.float32) + np.float32(client * 10000 + seq)
                started = time.monotonic()
                outcome, detail = send(rid, values)
                self._record(Call(rid, started, time.monotonic(), outcome, detail))
        finally:
            send.close()  # type: ignore[attr-defined]

    def _http_sender(self) -> Callable[[str, np.ndarray], tuple[str, str]]:
        client = httpx.Client(base_url=self.target, timeout=CALL_TIMEOUT_S)
        path = f"/v2/models/{MODEL}/infer"

        def send(rid: str, values: np.ndarray) -> tuple[str, str]:
            body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, WIDTH], "data": values.tolist()}]}
            try:
                response = client.post(path, json=body, headers={"X-Request-ID": rid})
            except httpx.HTTPError as exc:
                return type(exc).__name__, str(exc)
            if response.status_code != 200:
                return str(response.status_code), response.text[:200]
            got = response.json()["outputs"][0]["data"]
            if got != (values + 1).tolist():  # an answer for another request would show here
                return "wrong answer", f"{got} for {values.tolist()}"
            return "ok", ""

        send.close = client.close  # type: ignore[attr-defined]
        return send

    def _grpc_sender(self) -> Callable[[str, np.ndarray], tuple[str, str]]:
        channel = grpc.insecure_channel(self.target)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        def send(rid: str, values: np.ndarray) -> tuple[str, str]:
            request = service_pb2.ModelInferRequest(model_name=MODEL, id=rid)
            request.inputs.add(name="INPUT", datatype="FP32", shape=[1, WIDTH])
            request.raw_input_contents.append(values.tobytes())
            try:
                reply = stub.ModelInfer(request, timeout=CALL_TIMEOUT_S, metadata=[("x-request-id", rid)])
            except grpc.RpcError as exc:
                return exc.code().name, str(exc.details())[:200]
            got = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32)
            if not np.array_equal(got, values + 1):
                return "wrong answer", f"{got.tolist()} for {values.tolist()}"
            return "ok", ""

        send.close = channel.close  # type: ignore[attr-defined]
        return send


def fail_timeout_s() -> float:
    match = re.search(r"fail_timeout=(\d+)s", shipped_text())
    assert match is not None
    return float(match.group(1))


@dataclass
class FaultRun:
    calls: list[Call]
    entries: list[Entry]
    fault_at: float  # the signal was sent
    dead_at: float  # the victim's process had exited
    victim: int
    exit_code: int

    def failures(self) -> list[Call]:
        return [c for c in self.calls if not c.ok]

    def in_flight_on_victim(self, fleet: Fleet) -> set[str]:
        """Request ids that nginx had sent to the victim and that were in flight while it died
        (between the signal and its exit)."""
        victim_address = {fleet.replicas[self.victim].http_address, fleet.replicas[self.victim].grpc_address}
        on_victim = {e.rid for e in self.entries if victim_address & set(e.tried)}
        return {
            c.rid for c in self.calls if c.started <= self.dead_at and c.ended >= self.fault_at and c.rid in on_victim
        }

    def summary(self, fleet: Fleet) -> str:
        outcomes = Counter(c.outcome for c in self.calls)
        retried = sum(len(e.tried) > 1 for e in self.entries)
        upstream_errors = [line for line in fleet.nginx.error_log().splitlines() if "upstream" in line]
        return (
            f"{len(self.calls)} calls, outcomes {dict(outcomes)}, {retried} retried by nginx, "
            f"served by replica {dict(sorted(fleet.served_by(self.entries).items()))}"
            + "".join(f"\n  failed: {c.rid} {c.outcome} {c.detail}" for c in self.failures()[:8])
            + "".join(f"\n  nginx: {line[line.find('[') :][:300]}" for line in upstream_errors[-12:])
        )


def run_fault(fleet: Fleet, protocol: str, fault: Callable[[ServerProcess], None], victim: int = 1) -> FaultRun:
    """Steady load; once every replica has answered, the fault hits ``victim`` while a batch runs on
    it; the load goes on until nginx has skipped the victim and tried it again (fail_timeout)."""
    target = fleet.nginx.url if protocol == "http" else fleet.nginx.grpc_address
    replica = fleet.replicas[victim]
    assert replica.process is not None
    with Load(protocol, target) as load:
        wait_until(lambda: load.ok_count() >= 50 and len(fleet.served_by(fleet.nginx.entries())) == REPLICAS, 30.0)
        wait_until(lambda: fleet.batch_running(victim), 10.0)
        fault_at = time.monotonic()
        fault(replica)
        exit_code = replica.process.wait(DRAIN_S + 30.0)
        dead_at = time.monotonic()
        # Past fail_timeout nginx sends the dead replica one request again: that one is retried too.
        wait_until(lambda: time.monotonic() > fault_at + DRAIN_S + fail_timeout_s() + 0.5, 30.0)
    return FaultRun(load.snapshot(), fleet.nginx.entries(), fault_at, dead_at, victim, exit_code)


def kill_9(replica: ServerProcess) -> None:
    replica.signal(signal.SIGKILL)


def sigterm(replica: ServerProcess) -> None:
    replica.signal(signal.SIGTERM)


# -- static checks: the shipped file agrees with the server's defaults -----------------------------


def _directive(block: str, name: str) -> list[str]:
    return re.findall(rf"^\s*{name} ([^;]*);", block, re.M)


def _server_blocks(text: str) -> tuple[str, str]:
    blocks = re.findall(r"^server \{\n(.*?)^\}", text, re.S | re.M)
    assert len(blocks) == 2, "expected an HTTP and a gRPC server block"
    http, grpc_block = sorted(blocks, key=lambda b: "grpc_pass" in b)
    return http, grpc_block


def test_shipped_config_matches_the_servers_limits() -> None:
    text = shipped_text()
    section = ServerSection()
    http, grpc_block = _server_blocks(text)
    assert _directive(http, "client_max_body_size") == [f"{DEFAULT_MAX_BODY_BYTES >> 20}m"]
    assert _directive(http, "client_header_timeout") == [f"{section.header_timeout_s:g}s"]
    for name in ("tensorgate_http", "tensorgate_grpc"):
        upstream = _upstream_block(text, name).group(1)
        assert re.search(r"^\s*least_conn;$", upstream, re.M)
        for timeout in _directive(upstream, "keepalive_timeout"):  # where idle connections are kept
            assert float(timeout.rstrip("s")) < section.keep_alive_s, "nginx must drop idle connections first"
        servers = _directive(upstream, "server")
        assert len(servers) == REPLICAS and all("max_fails=" in s and "fail_timeout=" in s for s in servers)
    assert _directive(_upstream_block(text, "tensorgate_http").group(1), "keepalive")  # pooled, see above
    (tries,) = _directive(http, "proxy_next_upstream_tries")
    assert 2 <= int(tries) <= REPLICAS
    # non_idempotent on the inference POSTs only, never at the server level or for management.
    assert _directive(http, "proxy_next_upstream")[0] == "error timeout http_502 http_503"
    locations = dict(re.findall(r"^    location (.*?) \{\n(.*?)^    \}", http, re.S | re.M))
    retried = {where for where, body in locations.items() if "non_idempotent" in body}
    assert retried == {
        r"~ ^/v2/models/[^/]+(/versions/[0-9]+)?/infer$",
        r"~ ^/v1/models/[^/]+(/versions/[0-9]+)?:predict$",
        r"~ ^/v2/models/[^/]+(/versions/[0-9]+)?/generate(_stream)?$",
        r"~ ^/v1/(chat/)?completions$",
    }
    assert "proxy_pass" not in locations["^~ /v2/repository"]
    assert "grpc_pass grpc://tensorgate_grpc;" in grpc_block and "http2;" in grpc_block
    # nginx never sends a gRPC call twice once it is sent: non_idempotent there would promise nothing.
    assert _directive(grpc_block, "grpc_next_upstream") == ["error timeout http_502 http_503"]


def test_render_replaces_only_addresses_ports_and_paths(tmp_path: Path) -> None:
    text = shipped_text()
    rendered = render(
        text,
        http_listen="127.0.0.1:1",
        grpc_listen="127.0.0.1:2",
        http_replicas=["127.0.0.1:11", "127.0.0.1:12", "127.0.0.1:13"],
        grpc_replicas=["127.0.0.1:21", "127.0.0.1:22", "127.0.0.1:23"],
        log_dir=tmp_path,
    )

    def neutral(line: str) -> str:
        line = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "ADDRESS", line)
        line = re.sub(r"^(\s*listen )\d+", r"\1ADDRESS", line)
        return re.sub(r"\S+/(tensorgate\.\w+\.log)", r"LOGS/\1", line)

    changed = [(a, b) for a, b in zip(text.splitlines(), rendered.splitlines(), strict=True) if a != b]
    assert len(changed) == 2 * REPLICAS + 2 + 4  # server lines, listen lines, two log lines per server block
    assert all(neutral(before) == neutral(after) for before, after in changed), changed


# -- through a real nginx --------------------------------------------------------------------------


def test_routes_through_nginx(fleet: Fleet) -> None:
    """Health is the replica's answer, management is refused, the body limit is the server's."""
    with httpx.Client(base_url=fleet.nginx.url, timeout=10.0) as client:
        ready = client.get("/v2/health/ready", headers={"X-Request-ID": "health-1"})
        assert ready.status_code == 200
        assert ready.headers["x-request-id"] == "health-1"  # echoed by the replica, not nginx
        refused = client.post("/v2/repository/index", headers={"X-Request-ID": "repo-1"})
        assert refused.status_code == 403 and "error" in refused.json()
        refused_load = client.post(f"/v2/repository/models/{MODEL}/load", headers={"X-Request-ID": "repo-2"})
        assert refused_load.status_code == 403
    # A body over the replicas' limit is refused by nginx on its Content-Length, before any body.
    with socket.create_connection(("127.0.0.1", fleet.nginx.http_port), timeout=10.0) as sock:
        sock.sendall(
            f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-ID: big-1\r\n"
            f"Content-Length: {DEFAULT_MAX_BODY_BYTES + 1}\r\n\r\n".encode()
        )
        assert sock.recv(4096).split(b"\r\n", 1)[0] == b"HTTP/1.1 413 Request Entity Too Large"
    with grpc.insecure_channel(fleet.nginx.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=10).ready
        with pytest.raises(grpc.RpcError) as refused_rpc:
            stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=10)
        assert refused_rpc.value.code() == grpc.StatusCode.PERMISSION_DENIED
    by_rid = {e.rid: e for e in fleet.nginx.entries()}
    assert by_rid["health-1"].tried and by_rid["health-1"].upstream_statuses == ("200",)
    assert by_rid["repo-1"].tried == () and by_rid["repo-2"].tried == ()  # never reached a replica
    assert by_rid["big-1"].tried == ()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_kill_9_one_replica_under_load(fleet: Fleet, protocol: str) -> None:
    """A replica killed while a batch runs on it."""
    run = run_fault(fleet, protocol, kill_9)
    assert run.exit_code == -signal.SIGKILL
    summary = run.summary(fleet)
    print(f"killed, {protocol}: {summary}")
    failures = run.failures()
    if protocol == "http":
        assert failures == [], summary
        # The kill hit requests in flight (a batch was running), and nginx sent them elsewhere.
        victim = fleet.replicas[run.victim].http_address
        assert any(e.tried[0] == victim and len(e.tried) > 1 and e.status == 200 for e in run.entries), summary
    else:
        # Calls already on the killed replica cannot be sent again by nginx; nothing else may fail.
        lost = {c.rid for c in failures}
        assert {c.outcome for c in failures} <= {"UNAVAILABLE"}, summary
        assert lost <= run.in_flight_on_victim(fleet), summary
        assert len(lost) <= CLIENTS
    assert sum(c.ok for c in run.calls) >= 100, summary


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sigterm_one_replica_under_load(fleet: Fleet, protocol: str) -> None:
    """A replica stopped with SIGTERM drains (ready false, serving on) and exits 0."""
    run = run_fault(fleet, protocol, sigterm)
    assert run.exit_code == 0
    summary = run.summary(fleet)
    print(f"stopped, {protocol}: {summary}")
    assert sum(c.ok for c in run.calls) >= 100, summary
    assert run.failures() == [], summary


def test_control_without_non_idempotent_loses_the_requests_in_flight(control_fleet: Fleet) -> None:
    """The killed replica's control: with `non_idempotent` removed, the requests on the killed replica are lost
    (502), and only those; this is what the shipped configuration prevents."""
    run = run_fault(control_fleet, "http", kill_9)
    summary = run.summary(control_fleet)
    print(f"killed, control: {summary}")
    lost = {c.rid for c in run.failures()}
    assert lost, summary
    assert {c.outcome for c in run.failures()} == {"502"}, summary
    assert lost <= run.in_flight_on_victim(control_fleet), summary


@pytest.fixture()
def faulty_fleet(tmp_path: Path, nginx_binary: str) -> Iterator[tuple[Fleet, Path]]:
    """Three replicas, each with its own repository of the fault-injection model (one instance);
    the marker returned breaks replica 1's."""
    markers = [tmp_path / f"broken-{i}" for i in range(REPLICAS)]

    def repository(i: int) -> Path:
        root = tmp_path / f"repo-{i}"
        write_faulty_model(root, MODEL, markers[i], fault="hang", count=1, bad_index=0, delay_ms=DELAY_MS)
        return root

    started = start_fleet(tmp_path, nginx_binary, repositories=repository)
    yield started, markers[1]
    stop_fleet(started)


@dataclass(frozen=True)
class BadInstanceRun:
    calls: list[Call]
    entries: list[Entry]
    broke_at: float  # the victim's instance was made bad
    unready_seen: float  # the victim's readiness was seen false


def break_and_heal(fleet: Fleet, marker: Path, protocol: str) -> BadInstanceRun:
    """Steady load through nginx while replica 1's only instance goes bad, the replica turns not
    ready, the others serve 300 calls, the instance heals, and nginx tries the replica again."""
    victim = fleet.replicas[1]
    target = fleet.nginx.url if protocol == "http" else fleet.nginx.grpc_address
    with Load(protocol, target) as load:
        wait_until(lambda: load.ok_count() >= 50 and len(fleet.served_by(fleet.nginx.entries())) == REPLICAS, 30.0)
        broke_at = time.monotonic()
        marker.touch()
        wait_until(lambda: httpx.get(f"{victim.url}/v2/health/ready").status_code != 200, 30.0)
        unready_seen = time.monotonic()
        broke = len(load.snapshot())
        wait_until(lambda: len(load.snapshot()) >= broke + 300, 30.0)  # served by the two others meanwhile
        marker.unlink()
        wait_until(lambda: httpx.get(f"{victim.url}/v2/health/ready").status_code == 200, 30.0)
        healed = time.monotonic()
        wait_until(lambda: time.monotonic() > healed + fail_timeout_s() + 1.0, 30.0)
    return BadInstanceRun(load.snapshot(), fleet.nginx.entries(), broke_at, unready_seen)


def test_a_replica_whose_only_instance_goes_bad_leaves_rotation(faulty_fleet: tuple[Fleet, Path]) -> None:
    """A replica gone bad, over HTTP: its batch hangs; the replica answers 503 for it at the batch timeout and turns
    not ready, nginx sends its requests to the other replicas; once healed it serves again."""
    fleet, marker = faulty_fleet
    run = break_and_heal(fleet, marker, "http")
    assert [c for c in run.calls if not c.ok] == [], [c for c in run.calls if not c.ok][:5]
    address = fleet.replicas[1].http_address
    # What the victim could not serve it answered 503, and nginx sent on to another replica.
    assert any(e.tried[0] == address and len(e.tried) > 1 and e.status == 200 for e in run.entries)
    assert any(e.served_by == address for e in run.entries[-100:] if e.status == 200)  # and it serves again


def test_a_replica_whose_only_instance_goes_bad_leaves_rotation_over_grpc(faulty_fleet: tuple[Fleet, Path]) -> None:
    """A replica gone bad, over gRPC: once not ready the replica refuses connections, so nginx sends every later call
    to the other replicas; once healed and ready it takes connections, and calls, again."""
    fleet, marker = faulty_fleet
    run = break_and_heal(fleet, marker, "grpc")
    by_rid = {e.rid: e for e in run.entries}
    failures = [c for c in run.calls if not c.ok]
    summary = f"{len(run.calls)} calls; lost: " + ", ".join(f"{c.rid} {c.outcome} {c.detail}" for c in failures[:8])
    print(f"gone bad, grpc: {summary}")
    address = fleet.replicas[1].grpc_address
    # Lost: only calls the victim held as its instance went bad, each sent there before it turned not
    # ready (at most one per client), answered UNAVAILABLE; nginx could not send them again.
    assert {c.outcome for c in failures} <= {"UNAVAILABLE"}, summary
    assert all(c.rid in by_rid and by_rid[c.rid].tried == (address,) for c in failures), summary
    assert all(run.broke_at <= c.ended and c.started <= run.unready_seen for c in failures), summary
    assert len(failures) <= CLIENTS, summary
    assert any(e.served_by == address for e in run.entries[-100:] if e.status == 200)  # and it serves again
