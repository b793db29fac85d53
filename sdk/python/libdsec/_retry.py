"""When and how long to wait before sending a call again."""

from __future__ import annotations

import random
from typing import Dict, Optional

from ._ops import Req
from .errors import ApiError, DsecConnectionError, DsecTimeoutError

BASE_DELAY = 0.2
MAX_DELAY = 5.0


def should_retry(req: Req, err: BaseException, headers: Optional[Dict[str, str]] = None) -> bool:
    """Idempotent calls are retried on 429, 503 and broken connections;
    other calls only on a 429 refused before any work was done. A 429
    without ``Retry-After`` (a used-up tenant quota) is not retried:
    waiting does not cure it."""
    if isinstance(err, DsecTimeoutError):
        return False
    if isinstance(err, DsecConnectionError):
        return req.idempotent
    if isinstance(err, ApiError):
        if err.status == 429:
            if not (headers or {}).get("retry-after"):
                return False
            return req.idempotent or req.retry_busy
        if err.status == 503:
            return req.idempotent
    return False


def delay(attempt: int, headers: Optional[Dict[str, str]] = None) -> float:
    """Exponential backoff with jitter; a Retry-After header wins."""
    if headers:
        ra = headers.get("retry-after")
        if ra:
            try:
                return min(float(ra), MAX_DELAY * 4)
            except ValueError:
                pass
    d = min(MAX_DELAY, BASE_DELAY * (2 ** attempt))
    return d * random.uniform(0.5, 1.5)
