"""``tensorgate serve``: flags override the config file, the file overrides defaults."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from tensorgate.config.loading import read_yaml, validate
from tensorgate.config.server_config import ServerConfig
from tensorgate.errors import ConfigError
from tensorgate.observability.logging import configure_logging

_FLAG_KEYS = {
    "model_repository": "model_repository",
    "host": "host",
    "http_port": "http_port",
    "grpc_port": "grpc_port",
    "metrics_port": "metrics_port",
    "log_level": "log_level",
    "log_format": "log_format",
    "ports_file": "ports_file",
    "drain_delay": "drain_delay_s",
    "exit_timeout": "exit_timeout_s",
    "max_body_bytes": "max_body_bytes",
    "grpc_max_message_bytes": "grpc_max_message_bytes",
    "trace_exporter": "trace_exporter",
    "trace_sample_ratio": "trace_sample_ratio",
    "replica_id": "replica_id",
    "server_name": "server_name",
    "model_control": "model_control",
    "repository_poll_secs": "repository_poll_s",
    "admin_keys_file": "admin_keys_file",
    "max_connections": "max_connections",
    "allowed_host": "allowed_hosts",
    "shared_memory": "shared_memory",
    "memory_budget_bytes": "memory_budget_bytes",
    "default_residency": "default_residency",
    "grpc_refuse_when_unready": "grpc_refuse_when_unready",
}
# Flags that set a key of a section inside ``server``: (flag, section, key).
_SECTION_FLAGS = (
    ("tls_cert", "tls", "cert_file"),
    ("tls_key", "tls", "key_file"),
    ("tls_client_ca", "tls", "client_ca_file"),
    ("api_keys_file", "auth", "api_keys_file"),
)
# Paths in the config, relative to the config file when it set them (else to the working directory).
_PATHS = (
    ("model_repository",),
    ("admin_keys_file",),
    ("tls", "cert_file"),
    ("tls", "key_file"),
    ("tls", "client_ca_file"),
    ("auth", "api_keys_file"),
    ("auth", "jwt", "jwks_file"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="a YAML server config (server: ..., models: [...])")
    parser.add_argument("--model-repository", type=Path, help="a model repository directory")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8080; 0 picks a free port)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 8081)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default 8082)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", choices=["json", "text"])
    parser.add_argument("--ports-file", type=Path, help="write the bound ports here as JSON once listening")
    parser.add_argument("--drain-delay", type=float, help="seconds to keep serving after SIGTERM")
    parser.add_argument("--exit-timeout", type=float, help="seconds to finish in-flight requests on shutdown")
    parser.add_argument("--max-body-bytes", type=int, help="largest accepted request body (default 64 MiB)")
    parser.add_argument(
        "--grpc-max-message-bytes", type=int, help="largest gRPC request message (default: --max-body-bytes)"
    )
    parser.add_argument("--no-metrics", action="store_true", help="record no metrics and open no metrics port")
    parser.add_argument("--no-access-log", action="store_true", help="write no per-request access log lines")
    parser.add_argument(
        "--trace-exporter", choices=["none", "console", "otlp"], help="where spans go (default none: no tracing)"
    )
    parser.add_argument("--trace-sample-ratio", type=float, help="share of new traces sampled, 0..1 (default 1)")
    parser.add_argument("--replica-id", help="this replica's name in log lines and in tensorgate_server_info")
    parser.add_argument(
        "--server-name",
        help="the name in the V2 server metadata (default tensorgate; 'triton' for clients that check it)",
    )
    parser.add_argument(
        "--grpc-refuse-when-unready",
        action="store_true",
        default=None,
        help="while not ready (loading, a model with no healthy instance, draining), refuse gRPC connections, "
        "so nginx tries another replica (docs/nginx.md)",
    )
    parser.add_argument(
        "--model-control",
        choices=["none", "poll", "explicit"],
        help="none: serve the repository as it was at startup (default); poll: rescan it and apply changes; "
        "explicit: load and unload through the repository API (needs --admin-keys-file)",
    )
    parser.add_argument("--repository-poll-secs", type=float, help="seconds between repository scans in poll mode")
    parser.add_argument("--admin-keys-file", type=Path, help="admin keys, one per line, for the repository API")
    parser.add_argument("--tls-cert", type=Path, help="serve HTTPS and gRPC over TLS with this certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, help="the private key of --tls-cert (PEM)")
    parser.add_argument(
        "--tls-client-ca", type=Path, help="mutual TLS: refuse clients without a certificate this CA signed"
    )
    parser.add_argument(
        "--api-keys-file", type=Path, help="turn authentication on: the API keys file (sha256 name roles [models])"
    )
    parser.add_argument("--max-connections", type=int, help="connections past this are closed as accepted")
    parser.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host name the HTTP ports answer besides loopback names (repeat; '*': any)",
    )
    parser.add_argument(
        "--shared-memory",
        choices=["none", "system"],
        help="system: local clients may pass tensors through /dev/shm regions (Triton's extension; default none)",
    )
    parser.add_argument(
        "--memory-budget-bytes",
        type=int,
        help="the memory the loaded models may hold in all, as measured at their loads (default: no bound)",
    )
    parser.add_argument(
        "--default-residency",
        choices=["resident", "on_demand"],
        help="for models whose config sets no model_residency: resident (default; loaded at startup) or "
        "on_demand (loaded on the first request, evicted when idle to stay within --memory-budget-bytes)",
    )


def build_config(args: argparse.Namespace) -> tuple[ServerConfig, Path, str]:
    data: dict[str, Any] = {}
    source = "command line"
    base_dir = Path.cwd()
    if args.config is not None:
        raw = read_yaml(args.config)
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{args.config}: expected a mapping at the top level")
        data = dict(raw or {})
        source = str(args.config)
        base_dir = args.config.resolve().parent
    server = dict(data.get("server") or {})
    for flag, key in _FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is not None:
            server[key] = value
    for flag, section, key in _SECTION_FLAGS:
        value = getattr(args, flag, None)
        if value is not None:
            server[section] = {**(server.get(section) or {}), key: value.resolve()}
            if flag == "tls_client_ca":  # the flag means mutual TLS; a config file may make it optional
                server[section].setdefault("require_client_cert", True)
    if getattr(args, "no_metrics", False):
        server["metrics_port"] = None
    if getattr(args, "no_access_log", False):
        server["access_log"] = False
    data["server"] = server
    config = validate(ServerConfig, data, source)
    # A relative path is relative to the config file when the file set it, else to the working directory.
    for keys in _PATHS:
        from_file = args.config is not None and (len(keys) > 1 or getattr(args, keys[0], None) is None)
        config = config.model_copy(update={"server": _resolved(config.server, keys, base_dir if from_file else None)})
    repo = config.server.model_repository
    if repo is not None and not repo.is_dir():
        raise ConfigError(f"{source}: key 'server.model_repository': {repo} is not a directory")
    return config, base_dir, source


def _resolved(section: Any, keys: tuple[str, ...], base: Path | None) -> Any:
    """``section`` with the path at ``keys`` made absolute (against ``base``, else the working directory)."""
    value = getattr(section, keys[0])
    if value is None:
        return section
    if len(keys) > 1:
        return section.model_copy(update={keys[0]: _resolved(value, keys[1:], base)})
    if value.is_absolute():
        return section
    return section.model_copy(update={keys[0]: base / value if base is not None else value.resolve()})


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    # Worker processes are fork+exec'd and never touch gRPC, so gRPC's fork handlers (and their
    # log line on every spawn) have nothing to do. Set before grpc is first imported.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    from tensorgate.server import Server, ignore_stop_signals

    try:
        config, base_dir, source = build_config(args)
    except ConfigError as exc:
        print(f"tensorgate: configuration error: {exc}", file=sys.stderr)
        return 2
    section = config.server
    configure_logging(section.log_level, section.log_format, section.access_log, section.replica_id)
    server = Server(config, config_dir=base_dir, config_source=source)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(server.serve())
        ignore_stop_signals()  # asyncio's own loop (without uvloop) restores SIG_DFL on close
    except ConfigError as exc:
        print(f"tensorgate: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tensorgate: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0
