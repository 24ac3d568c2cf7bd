"""HTTP calls to providers with one mapping of failures to typed errors.

Connection errors, timeouts, 5xx and 429 are transient (429 with its Retry-After); other 4xx
are permanent unless a provider's own error code says otherwise, which the provider decides
through `classify`. Bodies of errors are parsed but never logged (they may echo a phone number).
A session from `gateway.egress.session` refuses internal addresses with `EgressRefused` (permanent,
code `egress_refused`), which goes through `call` as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Mapping

import requests

from gateway.errors import PermanentError, ProviderError, TransientError


@dataclass(frozen=True)
class HttpResponse:
    """A provider's answer: status, headers and the body parsed as JSON when it is JSON."""

    status: int
    headers: Mapping[str, str]
    body: Any
    text: str


#: Given a non-2xx response, return the error to raise, or None for the default mapping.
Classifier = Callable[[HttpResponse], "ProviderError | None"]


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds (it may be a number or an HTTP date)."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        from datetime import datetime, timezone

        return max((parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds(), 0.0)
    except (TypeError, ValueError):
        return None


def call(
    session: requests.Session,
    method: str,
    url: str,
    *,
    timeout: float,
    classify: Classifier | None = None,
    **kwargs: Any,
) -> HttpResponse:
    """Make one request; return the response on 2xx, raise TransientError / PermanentError otherwise."""
    try:
        raw = session.request(method, url, timeout=timeout, allow_redirects=False, **kwargs)
    except requests.ConnectTimeout:
        raise TransientError("could not reach the provider in time", code="connect_timeout") from None
    except requests.Timeout:
        # The request went out; the provider may have acted on it before we stopped waiting.
        raise TransientError("provider did not answer in time", code="timeout", outcome_unknown=True) from None
    except requests.ConnectionError:
        raise TransientError("could not connect to the provider", code="connection_error") from None
    except requests.RequestException as exc:
        raise TransientError(f"request failed ({type(exc).__name__})", code="request_error") from None
    text = raw.text
    try:
        body: Any = raw.json() if text else None
    except (ValueError, json.JSONDecodeError):
        body = None
    response = HttpResponse(status=raw.status_code, headers=raw.headers, body=body, text=text)
    if 200 <= raw.status_code < 300:
        return response
    if classify is not None:
        error = classify(response)
        if error is not None:
            raise error
    raise default_error(response)


def default_error(response: HttpResponse) -> ProviderError:
    """The status-code mapping every provider starts from."""
    status = response.status
    if status == 429:
        return TransientError("provider is throttling", code="http_429",
                              retry_after=retry_after_seconds(response.headers.get("Retry-After")))
    if status >= 500 or status == 408:
        return TransientError(f"provider error (HTTP {status})", code=f"http_{status}")
    if status in (401, 403):
        return PermanentError(f"provider refused the credentials (HTTP {status})", code=f"http_{status}",
                              channel_broken=True)
    return PermanentError(f"provider refused the request (HTTP {status})", code=f"http_{status}")
