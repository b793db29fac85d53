"""Typed exceptions of libdsec.

Every error the dsec API returns comes back as a subclass of :class:`ApiError`
chosen by the error's ``code`` (``not_found`` -> :class:`NotFoundError`, ...),
carrying the server's message. Failures to reach the server raise
:class:`DsecConnectionError`; a call that runs out of its client-side timeout
raises :class:`DsecTimeoutError`.
"""

from __future__ import annotations

import json
from typing import Dict, Optional, Type

__all__ = [
    "DsecError",
    "ApiError",
    "InvalidArgumentError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "NotFoundError",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "TooLargeError",
    "ResourceExhaustedError",
    "DeadlineExceededError",
    "UnavailableError",
    "InternalError",
    "DsecConnectionError",
    "DsecTimeoutError",
    "ExecError",
    "error_from_response",
]


class DsecError(Exception):
    """Base class of every libdsec error."""


class ApiError(DsecError):
    """An error answered by the dsec API.

    Attributes:
        code: the API's error code, e.g. ``"not_found"``.
        message: the server's message, for humans.
        status: the HTTP status, or 0 when the error was not an HTTP answer.
    """

    code = "internal"

    def __init__(self, message: str, *, code: Optional[str] = None, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class InvalidArgumentError(ApiError):
    """400: malformed or invalid request."""

    code = "invalid_argument"


class UnauthenticatedError(ApiError):
    """401: missing, malformed or unknown API key."""

    code = "unauthenticated"


class PermissionDeniedError(ApiError):
    """403: the key may not do this."""

    code = "permission_denied"


class NotFoundError(ApiError):
    """404: no such sandbox, layer, process, file or route (or another tenant's)."""

    code = "not_found"


class AlreadyExistsError(ApiError):
    """409: the thing already exists."""

    code = "already_exists"


class FailedPreconditionError(ApiError):
    """409: the sandbox or process is in the wrong state for this call."""

    code = "failed_precondition"


class TooLargeError(ApiError):
    """413: a body, file or layer over its limit."""

    code = "too_large"


class ResourceExhaustedError(ApiError):
    """429: no room on any node, or a disk or descriptor limit inside the sandbox."""

    code = "resource_exhausted"


class DeadlineExceededError(ApiError):
    """504: a deadline ran out on the server."""

    code = "deadline_exceeded"


class UnavailableError(ApiError):
    """503: the sandbox's node or agent cannot be reached."""

    code = "unavailable"


class InternalError(ApiError):
    """500: anything else."""

    code = "internal"


class DsecConnectionError(UnavailableError, ConnectionError):
    """The server could not be reached, or the connection broke mid-call."""

    code = "unavailable"


class DsecTimeoutError(DeadlineExceededError, TimeoutError):
    """The call did not finish within its client-side timeout."""

    code = "deadline_exceeded"


class ExecError(DsecError):
    """A command exited non-zero and ``check=True`` was asked for.

    Attributes:
        result: the :class:`libdsec.ExecResult`.
    """

    def __init__(self, result: "object") -> None:
        code = getattr(result, "exit_code", None)
        stderr = getattr(result, "stderr", "")
        super().__init__(f"command exited with status {code}: {stderr[-500:]}")
        self.result = result


_BY_CODE: Dict[str, Type[ApiError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        UnauthenticatedError,
        PermissionDeniedError,
        NotFoundError,
        AlreadyExistsError,
        FailedPreconditionError,
        TooLargeError,
        ResourceExhaustedError,
        DeadlineExceededError,
        UnavailableError,
        InternalError,
    )
}

_CODE_FOR_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "failed_precondition",
    413: "too_large",
    429: "resource_exhausted",
    502: "unavailable",
    503: "unavailable",
    504: "deadline_exceeded",
}


def error_from_code(code: str, message: str, status: int = 0) -> ApiError:
    """Builds the exception of an API error code."""
    cls = _BY_CODE.get(code, ApiError)
    return cls(message or code, code=code, status=status)


def error_from_response(status: int, body: bytes, reason: str = "") -> ApiError:
    """Turns a non-2xx answer into the exception of its error code.

    An answer without the API's ``{"error": {...}}`` body (a proxy's 502, say)
    gets the code that its status implies.
    """
    try:
        err = json.loads(body.decode("utf-8"))["error"]
        return error_from_code(str(err["code"]), str(err.get("message", "")), status)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        pass
    code = _CODE_FOR_STATUS.get(status, "internal")
    text = body.decode("utf-8", "replace").strip()[:500] or f"HTTP {status} {reason}".strip()
    return error_from_code(code, text, status)
