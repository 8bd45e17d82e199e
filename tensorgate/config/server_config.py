"""Server configuration: inert data. The :class:`~tensorgate.server.Server` owns runtime state."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tensorgate.config.model_config import DEFAULT_MAX_QUEUE_SIZE, DynamicBatching, Strict

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class TlsSection(Strict):
    """HTTPS and gRPC over TLS on the same ports; mutual TLS with a client CA."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None  # verify client certificates against this CA
    require_client_cert: bool = False  # refuse, in the handshake, a client without one

    @model_validator(mode="after")
    def _mutual(self) -> TlsSection:
        if self.require_client_cert and self.client_ca_file is None:
            raise ValueError("require_client_cert needs client_ca_file (the CA that signs client certificates)")
        return self


class RateLimitSection(Strict):
    """A token bucket per identity: ``requests_per_s`` on average, up to ``burst`` at once."""

    requests_per_s: float = Field(gt=0)
    burst: int | None = Field(default=None, ge=1)  # None: one second's worth


class JwtSection(Strict):
    """OAuth2 bearer tokens checked offline against the keys of a JWKS file."""

    jwks_file: Path
    issuer: str
    audience: str
    leeway_s: float = Field(default=30.0, ge=0)
    roles_claim: str = "scope"  # "scope" (space-separated) or a claim holding a list ("roles")
    models_claim: str | None = None  # a claim listing the models the token may use; None: all


class AuthSection(Strict):
    """Who may call: API keys, JWTs, or both. On when either is set; health stays open by default."""

    api_keys_file: Path | None = None
    jwt: JwtSection | None = None
    public_health: bool = True  # /v2/health/* and gRPC health answer without credentials
    rate_limit: RateLimitSection | None = None  # the default for identities the keys file gives none
    max_inflight: int | None = Field(default=None, ge=1)  # per identity, unless its key line says

    @model_validator(mode="after")
    def _some_source(self) -> AuthSection:
        if self.api_keys_file is None and self.jwt is None:
            raise ValueError("auth needs api_keys_file or jwt (who may call)")
        return self


class TenantConfig(Strict):
    weight: float = Field(default=1.0, gt=0)  # its share against other waiting tenants'
    # Requests it may have waiting in one model version's queue; past it, 503 for it alone.
    max_queued: int | None = Field(default=None, ge=1)


class ServerSection(Strict):
    host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    grpc_port: int | None = Field(default=8081, ge=0, le=65535)
    metrics_port: int | None = Field(default=8082, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"
    access_log: bool = True
    model_repository: Path | None = None
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    # The largest gRPC message either way; None: the HTTP body limit, so both protocols take the same
    # tensors (gRPC's own default of 4 MiB is under one 640x640 RGB image in FP32).
    grpc_max_message_bytes: int | None = Field(default=None, ge=1024)
    max_json_depth: int = Field(default=100, ge=2, le=1000)
    max_elements: int = Field(default=1 << 28, ge=1)
    drain_delay_s: float = Field(default=0.0, ge=0)
    exit_timeout_s: float = Field(default=30.0, ge=0)
    header_timeout_s: float = Field(default=10.0, gt=0)
    # A request body not all received this long after its request's turn came: 408 and the connection
    # closed, so a client that declares a length and trickles the bytes cannot hold the connection.
    body_timeout_s: float = Field(default=60.0, gt=0)
    keep_alive_s: float = Field(default=75.0, gt=0)
    # A gRPC connection with no call open this long gets GOAWAY (clients reconnect); None: never.
    grpc_idle_timeout_s: float | None = Field(default=600.0, gt=0)
    # While the server is not ready (loading, a model with no healthy instance, draining), the gRPC
    # port takes no connection: nginx, which cannot send a gRPC call twice once it has sent it, then
    # tries another replica instead of passing this one's UNAVAILABLE on (docs/nginx.md).
    grpc_refuse_when_unready: bool = False
    # Port 0 asks the OS for a free port; the chosen ports are written here when given, so a
    # supervisor (or a test) can find them.
    ports_file: Path | None = None
    # Tracing (W3C traceparent, OpenTelemetry): "none" creates no spans at all; "console" and
    # "otlp" need the otel extra. New traces are sampled at this ratio; a client's decision wins.
    trace_exporter: Literal["none", "console", "otlp"] = "none"
    trace_sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    # Names this server among the replicas behind one load balancer: on every log line and in the
    # tensorgate_server_info metric, so logs and scrapes of several replicas can be told apart.
    replica_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
    # The server's name in its V2 metadata (GET /v2, ServerMetadata). Clients written for Triton
    # that check it (Triton's health_metadata examples assert "triton") need server_name: triton.
    server_name: str = Field(default="tensorgate", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    # Triton's model control modes: none (the repository as it was at startup), poll (rescan it and
    # apply what changed), explicit (the repository API loads and unloads, with an admin key).
    model_control: Literal["none", "poll", "explicit"] = "none"
    repository_poll_s: float = Field(default=5.0, gt=0)
    admin_keys_file: Path | None = None  # one key per line; the repository API needs one of them
    tls: TlsSection | None = None
    metrics_tls: bool = False  # the metrics port too (else plain text, for a scraper inside the cluster)
    auth: AuthSection | None = None
    # Connections past this are closed as they are accepted (HTTP and gRPC each); None: no cap.
    max_connections: int | None = Field(default=None, ge=1)
    # The Host names the HTTP ports answer besides loopback names ("*": any); None: any name when
    # bound beyond loopback, only loopback names when bound to it (security/hosts.py).
    allowed_hosts: list[str] | None = None
    # Triton's system shared-memory extension (tensors in /dev/shm regions that local clients
    # register): off unless asked for, as a region reaches files of this host (checklist S-12).
    shared_memory: Literal["none", "system"] = "none"
    # Triton's response cache, shared by the models that enable it (response_cache: {enable: true}):
    # the outputs it may hold in all, least recently used first out.
    response_cache_bytes: int = Field(default=64 << 20, ge=0)
    # Models in bounded memory (docs/model-residency.md): the bytes the loaded models may hold in all,
    # as measured at each load; None: no bound. Room is made by evicting idle on_demand models, least
    # recently used first; resident ones are never evicted.
    memory_budget_bytes: int | None = Field(default=None, ge=1)
    # What a model's model_residency is when its config does not say: resident (loaded at startup and
    # kept) or on_demand (loaded on its first request, evicted when idle and room is needed).
    default_residency: Literal["resident", "on_demand"] = "resident"
    # Fair sharing between tenants (docs/fairness.md): within a priority level, requests leave in
    # weighted fair order across tenants. A tenant is the authenticated caller's name, else this
    # header's value (gRPC: the same name, lower case, as metadata), else one shared tenant.
    fair_queuing: bool = True
    tenant_header: str = Field(default="X-Tenant", pattern=r"^[A-Za-z0-9-]{1,64}$")
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)  # unknown tenants: weight 1, no bound

    @model_validator(mode="after")
    def _management(self) -> ServerSection:
        if self.model_control == "explicit" and self.admin_keys_file is None:
            raise ValueError(
                "model_control explicit opens the repository API, which needs admin_keys_file "
                "(a file of admin keys, one per line)"
            )
        if self.metrics_tls and self.tls is None:
            raise ValueError("metrics_tls needs tls (the certificate to serve the metrics port with)")
        return self


class FlatDynamicBatching(Strict):
    """``dynamic_batching`` as the single-file form writes it (``max_delay_ms``)."""

    max_batch_size: int = Field(default=8, ge=1)
    max_delay_ms: float = Field(default=5.0, ge=0)
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    max_queue_size: int | None = Field(default=None, ge=1)
    adaptive_delay: bool = True

    def to_dynamic_batching(self) -> DynamicBatching:
        return DynamicBatching(
            max_batch_size=self.max_batch_size,
            max_queue_delay_ms=self.max_delay_ms,
            preferred_batch_sizes=self.preferred_batch_sizes,
            max_queue_size=self.max_queue_size or DEFAULT_MAX_QUEUE_SIZE,
            adaptive_delay=self.adaptive_delay,
        )


class FlatModelEntry(Strict):
    """One model in the single-file form operators write for NPU inference servers."""

    name: str
    version: int = Field(default=1, ge=1)
    model_path: Path
    input_shape: list[int] | None = None
    dynamic_batching: FlatDynamicBatching | None = None
    device_id: int | None = Field(default=None, ge=0)
    device: Literal["cpu", "gpu", "npu"] = "cpu"
    backend: Literal["onnxruntime", "python", "torch", "llm"] | None = None


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerSection = Field(default_factory=ServerSection)
    models: list[FlatModelEntry] = Field(default_factory=list)
