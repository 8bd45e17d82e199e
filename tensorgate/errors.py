"""The error hierarchy and the one table that maps each error to HTTP and gRPC.

Every error the core raises is a :class:`TensorgateError` carrying an :class:`ErrorCode`.
Protocol layers translate the code through :data:`ERROR_TABLE`; nothing else decides a status.
Messages are for clients: they name the problem (which input, expected vs got) and never carry
stack traces, absolute paths or internal names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ErrorCode(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    UNSUPPORTED_MEDIA = "unsupported_media"
    RATE_LIMITED = "rate_limited"
    INTERNAL = "internal"
    NOT_IMPLEMENTED = "not_implemented"
    UNAVAILABLE = "unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    METHOD_NOT_ALLOWED = "method_not_allowed"


@dataclass(frozen=True, slots=True)
class StatusPair:
    http: int
    grpc: str  # the name of a grpc.StatusCode member; protocols resolve it, so no grpc import here


ERROR_TABLE: dict[ErrorCode, StatusPair] = {
    ErrorCode.INVALID_ARGUMENT: StatusPair(400, "INVALID_ARGUMENT"),
    ErrorCode.UNAUTHENTICATED: StatusPair(401, "UNAUTHENTICATED"),
    ErrorCode.PERMISSION_DENIED: StatusPair(403, "PERMISSION_DENIED"),
    ErrorCode.NOT_FOUND: StatusPair(404, "NOT_FOUND"),
    ErrorCode.METHOD_NOT_ALLOWED: StatusPair(405, "UNIMPLEMENTED"),
    ErrorCode.TOO_LARGE: StatusPair(413, "RESOURCE_EXHAUSTED"),
    ErrorCode.UNSUPPORTED_MEDIA: StatusPair(415, "INVALID_ARGUMENT"),
    ErrorCode.RATE_LIMITED: StatusPair(429, "RESOURCE_EXHAUSTED"),
    ErrorCode.INTERNAL: StatusPair(500, "INTERNAL"),
    ErrorCode.NOT_IMPLEMENTED: StatusPair(501, "UNIMPLEMENTED"),
    ErrorCode.UNAVAILABLE: StatusPair(503, "UNAVAILABLE"),
    ErrorCode.DEADLINE_EXCEEDED: StatusPair(504, "DEADLINE_EXCEEDED"),
    # A cancelled request gets no HTTP answer (the client is gone); 499 is what proxies log for it.
    ErrorCode.CANCELLED: StatusPair(499, "CANCELLED"),
}

# Failure reasons as they appear in metrics and access logs.
OUTCOME_BY_CODE: dict[ErrorCode, str] = {
    ErrorCode.INVALID_ARGUMENT: "invalid",
    ErrorCode.UNAUTHENTICATED: "unauthenticated",
    ErrorCode.PERMISSION_DENIED: "forbidden",
    ErrorCode.NOT_FOUND: "not_found",
    ErrorCode.METHOD_NOT_ALLOWED: "invalid",
    ErrorCode.TOO_LARGE: "invalid",
    ErrorCode.UNSUPPORTED_MEDIA: "invalid",
    ErrorCode.RATE_LIMITED: "rate_limited",
    ErrorCode.INTERNAL: "error",
    ErrorCode.NOT_IMPLEMENTED: "invalid",
    ErrorCode.UNAVAILABLE: "unavailable",
    ErrorCode.DEADLINE_EXCEEDED: "timeout",
    ErrorCode.CANCELLED: "cancelled",
}


class TensorgateError(Exception):
    """An error with a client-facing message and one code from the table."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def http_status(self) -> int:
        return ERROR_TABLE[self.code].http

    @property
    def grpc_status(self) -> str:
        return ERROR_TABLE[self.code].grpc

    @property
    def outcome(self) -> str:
        return OUTCOME_BY_CODE[self.code]


class InvalidInput(TensorgateError):
    code = ErrorCode.INVALID_ARGUMENT


class Unauthenticated(TensorgateError):
    code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(TensorgateError):
    code = ErrorCode.PERMISSION_DENIED


class NotFound(TensorgateError):
    code = ErrorCode.NOT_FOUND


class MethodNotAllowed(TensorgateError):
    code = ErrorCode.METHOD_NOT_ALLOWED


class TooLarge(TensorgateError):
    code = ErrorCode.TOO_LARGE


class UnsupportedMedia(TensorgateError):
    code = ErrorCode.UNSUPPORTED_MEDIA


class RateLimited(TensorgateError):
    code = ErrorCode.RATE_LIMITED


class InternalError(TensorgateError):
    code = ErrorCode.INTERNAL


class NotImplementedFeature(TensorgateError):
    code = ErrorCode.NOT_IMPLEMENTED


class Unavailable(TensorgateError):
    code = ErrorCode.UNAVAILABLE


class QueueFull(Unavailable):
    """The model's queue is at ``max_queue_size``: rejected at once, never blocked."""

    @property
    def outcome(self) -> str:
        return "queue_full"


class WouldMissDeadline(Unavailable):
    """Refused at admission: the queue ahead and the model's measured cost say the request cannot
    finish before its deadline (``dynamic_batching.deadline_admission``). 503, not 504: nothing was
    attempted, and the client is told when to come back."""

    @property
    def outcome(self) -> str:
        return "deadline_refused"


class DeadlineExceeded(TensorgateError):
    code = ErrorCode.DEADLINE_EXCEEDED


class Cancelled(TensorgateError):
    code = ErrorCode.CANCELLED


# The message of the cancellation a protocol delivers when the client's deadline passes (gRPC's
# ``grpc-timeout``), so the scheduler counts a timeout: the request's own deadline, computed a
# moment later from the time remaining, may not have passed yet by its clock.
DEADLINE_CANCEL = "the client's deadline passed"


class ModelLoadError(Exception):
    """A model version failed to load. Not a client error: it marks that version FAILED."""


class ConfigError(Exception):
    """A configuration file is wrong. The message names the file, the key and what was expected."""
