"""Typed errors shared by the proxy and the launcher, and the one place that maps them to HTTP statuses.

Every error leaves a component as ``{"error": {"type": ..., "message": ...}}``.
"""

from __future__ import annotations

import orjson


class SessionMemError(Exception):
    """Base of every error a caller may see; ``error_type`` and ``status`` travel on the wire."""

    error_type = "internal"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> bytes:
        return error_body(self.error_type, self.message)

    def headers(self) -> list[tuple[str, str]]:
        """Headers the answer carries besides the content type (Retry-After on a 429)."""
        return []


class InvalidRequest(SessionMemError):
    error_type = "invalid_request"
    status = 400


class InvalidConversationId(InvalidRequest, ValueError):
    """Also a ValueError: frameworks built on the client (agent sessions, chat histories) document and
    test a bad session id as one."""

    error_type = "invalid_conversation_id"


class InvalidMessageId(InvalidRequest):
    error_type = "invalid_message_id"


class MalformedRequest(InvalidRequest):
    """A request head the server will not frame or route as sent: a repeated field that decides identity,
    scope, conversation or framing, no Host, a transfer coding other than ``chunked``, a path with
    dot-segments. The connection is closed after the answer: what follows on it may not be framed as the
    client meant."""

    error_type = "malformed_request"

    def headers(self) -> list[tuple[str, str]]:
        return [("connection", "close")]


class Unauthenticated(SessionMemError):
    error_type = "unauthenticated"
    status = 401


class UserCapabilityRequired(Unauthenticated):
    """An agent that keeps memory per user was called without the user's run capability: refused, never
    answered from a shared bucket."""

    error_type = "user_capability_required"


class TurnNotLive(Unauthenticated):
    """A memory call named a turn handle that is not bound (never was, or its turn is over): a handle acts
    for its user only while the request it came with is in flight."""

    error_type = "turn_not_live"


class CapabilityNotAccepted(Unauthenticated):
    """A user capability sent to the agent's memory endpoint: the endpoint takes turn handles only, so a
    capability that leaked to the agent process buys nothing there."""

    error_type = "capability_not_accepted"


class Forbidden(SessionMemError):
    error_type = "forbidden"
    status = 403


class NotFound(SessionMemError):
    error_type = "not_found"
    status = 404


class VersionConflict(SessionMemError):
    error_type = "version_conflict"
    status = 412


class ConversationExists(SessionMemError):
    """A write that creates a conversation (a fork) found one under that id already."""

    error_type = "conversation_exists"
    status = 409


class PayloadTooLarge(SessionMemError):
    error_type = "payload_too_large"
    status = 413


class MethodNotAllowed(SessionMemError):
    error_type = "method_not_allowed"
    status = 405


class RequestTimeout(SessionMemError):
    """The request body did not arrive within the server's body timeout."""

    error_type = "request_timeout"
    status = 408


class UriTooLong(SessionMemError):
    error_type = "uri_too_long"
    status = 414


class HeadersTooLarge(SessionMemError):
    """The request head has more header fields, or more bytes, than the server accepts."""

    error_type = "headers_too_large"
    status = 431


class Overloaded(SessionMemError):
    """The worker already serves as many requests as it is allowed to: retry later (another replica)."""

    error_type = "overloaded"
    status = 503


class RateLimited(SessionMemError):
    """The agent sent more requests than its rate allows; ``retry_after`` seconds until it may again.
    ``hold_seconds``: how long the answer waits before it is sent (an agent asking again before the
    ``Retry-After`` it was given had passed: ``sessionmem_proxy.admission.Quotas``)."""

    error_type = "rate_limited"
    status = 429

    def __init__(self, message: str, retry_after: int = 1, hold_seconds: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)
        self.hold_seconds = hold_seconds

    def headers(self) -> list[tuple[str, str]]:
        return [("retry-after", str(self.retry_after))]


class QuotaExceeded(SessionMemError):
    """The agent's stored conversations or bytes are at its quota: nothing more is stored for it."""

    error_type = "quota_exceeded"
    status = 507


class BackendUnavailable(SessionMemError):
    """The memory backend (Valkey, or the proxy seen from the launcher) cannot be reached in time."""

    error_type = "backend_unavailable"
    status = 503


class ConversationBusy(BackendUnavailable):
    """A read of a large window was overtaken by a write to the same conversation every time it was tried
    (each attempt is discarded whole, never answered mixed): retry after a moment."""

    error_type = "conversation_busy"

    def headers(self) -> list[tuple[str, str]]:
        return [("retry-after", "1")]


class AuthUnavailable(SessionMemError):
    """The identity service (TokenReview) cannot be reached: we fail closed."""

    error_type = "auth_unavailable"
    status = 503


class DataKeyUnavailable(SessionMemError):
    """Encryption at rest: the data key a read or write needs cannot be had (its store cannot be reached,
    or its key-encryption key left the keyring). We fail closed: nothing is stored unsealed, nothing is
    read without its key."""

    error_type = "data_key_unavailable"
    status = 503


class SealedEntryInvalid(SessionMemError):
    """Encryption at rest: a sealed entry (or a wrapped data key) does not open under the conversation and
    id it is stored at: it was altered or moved. Refused, never returned."""

    error_type = "sealed_entry_invalid"
    status = 500


def error_body(error_type: str, message: str) -> bytes:
    return orjson.dumps({"error": {"type": error_type, "message": message}})


_BY_TYPE: dict[str, type[SessionMemError]] = {}


def _register(cls: type[SessionMemError]) -> None:
    _BY_TYPE[cls.error_type] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(SessionMemError)


def from_wire(status: int, body: bytes) -> SessionMemError:
    """Rebuild a typed error from a response body, so a client re-raises what the server raised."""
    try:
        err = orjson.loads(body)["error"]
        error_type, message = str(err["type"]), str(err["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        error_type, message = "", body[:200].decode("utf-8", "replace")
    cls = _BY_TYPE.get(error_type)
    if cls is None:
        exc = SessionMemError(message or f"HTTP {status}")
        exc.status = status
        exc.error_type = error_type or "internal"
        return exc
    return cls(message)
