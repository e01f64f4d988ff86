"""Typed worker errors: each carries a PascalCase `reason`, a message that says what
failed, why and the fix, and the HTTP status the API answers with.

Raised by config loading, admission, the scheduler and request parsing;
api.py turns them into OpenAI-shaped error bodies.
"""
from __future__ import annotations


class WorkerError(Exception):
    """Base: `reason` (PascalCase) and `message`; `status` is the HTTP status for the API."""

    status = 500
    error_type = "server_error"

    def __init__(self, reason: str, message: str, *, param: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.param = param


class ConfigError(WorkerError):
    """The worker config file is missing, unreadable or does not match its schema."""


class ModelLoadError(WorkerError):
    """A model's files cannot be found or read (shape or weights)."""


class InvalidRequest(WorkerError):
    """A request body is malformed or asks for something the model cannot do (HTTP 400)."""

    status = 400
    error_type = "invalid_request_error"


class ModelNotFound(WorkerError):
    """The request names a model this worker does not serve (HTTP 404)."""

    status = 404
    error_type = "invalid_request_error"


class ModelUnavailable(WorkerError):
    """The model is configured but refused or still loading (HTTP 503)."""

    status = 503
    error_type = "service_unavailable_error"

    def __init__(self, reason: str, message: str, *, retry_after_s: int | None = None):
        super().__init__(reason, message)
        self.retry_after_s = retry_after_s


class QueueFull(WorkerError):
    """More queued requests for a model than server.maxQueuedRequests (HTTP 429)."""

    status = 429
    error_type = "rate_limit_error"

    def __init__(self, reason: str, message: str, *, retry_after_s: int):
        super().__init__(reason, message)
        self.retry_after_s = retry_after_s


class RequestTooLarge(WorkerError):
    """The request body is larger than server.maxRequestBytes (HTTP 413); refused before it is parsed."""

    status = 413
    error_type = "invalid_request_error"


class Unauthenticated(WorkerError):
    """A request without a credential where the worker authorises each request (worker.auth)."""

    status = 401
    error_type = "authentication_error"


class SchemaRefused(InvalidRequest):
    """A response_format or tools schema beyond one of the bounds worker/schemabound.py (or the grammar library)
    sets: 400 UnsupportedSchema; `limit` names the bound (depth, expanded, width, ref, tools, library, deadline),
    the label of gpushare_worker_grammar_refusals_total."""

    def __init__(self, limit: str, message: str, *, param: str | None = None):
        super().__init__("UnsupportedSchema", message, param=param)
        self.limit = limit
