"""HTTP calls to providers: one keep-alive client, and one mapping of failures to typed errors.

Connection errors, timeouts, 5xx and 429 are transient (429 with its Retry-After); other 4xx
are permanent unless a provider's own error code says otherwise, which the provider decides
through `classify`. Bodies of errors are parsed but never logged (they may echo a phone number).
A `Client` refuses internal addresses with `EgressRefused` (permanent, code `egress_refused`),
which goes through `call` as it is.

A call's `timeout` is its whole duration, connect to the answer's last byte, and its answer is
read up to `max_bytes` (`gateway.limits`): a provider that trickles its answer or sends far too
much ends the call at the deadline or the cap, as a transient error whose outcome is unknown.

The client is urllib3's pools, not requests: per call requests merged settings, built a
prepared request, a cookie jar and a response object around urllib3's, which cost about as
much CPU as the loopback call itself (docs/benchmarks-history.md, 2026-12-03). Lembra needs none of
that: no cookies, no redirects, no retries (a retry is the outbox's to decide), no netrc.
"""

from __future__ import annotations

import functools
import json as jsonlib
import threading
import urllib.request
from base64 import b64encode
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Mapping
from urllib.parse import urlencode

import certifi
import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    LocationValueError,
    NewConnectionError,
    ProtocolError,
    ProxyError,
    SSLError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util import Url, parse_url

from gateway import egress, limits
from gateway.errors import PermanentError, ProviderError, TransientError

__all__ = ["Classifier", "Client", "HttpResponse", "call", "default_error", "retry_after_seconds"]

USER_AGENT = "lembra"
#: Connections kept per provider host: as many as a worker process has provider calls in flight.
POOL_SIZE = 32
#: The largest answer a provider call reads (a send's answer is a few hundred bytes; a listing a
#: few hundred kB): past it the call ends, so that a hostile or broken server cannot fill memory.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
#: How much of an answer is read (and decoded) at a time.
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class HttpResponse:
    """A provider's answer: status, headers, the body parsed as JSON when it is JSON, the body as
    text, and the status line's reason phrase as the server wrote it ("" in HTTP/2 or when absent)."""

    status: int
    headers: Mapping[str, str]
    body: Any
    text: str
    #: The answer's bytes as read (downloaded media is not text).
    content: bytes = b""
    reason: str = ""


#: Given a non-2xx response, return the error to raise, or None for the default mapping.
Classifier = Callable[[HttpResponse], "ProviderError | None"]


class Client:
    """One provider account's HTTP client: keep-alive pools whose every new connection passes
    the egress guard (`gateway.egress.pool_manager`). Thread-safe: a worker's send threads share it.

    A proxy configured in the environment when the client is made (`HTTPS_PROXY`, `NO_PROXY`…)
    is used as requests used it: the proxy connects, so the target's addresses are checked by
    the policy first and the proxy's own rules hold after that.
    """

    def __init__(self, policy: egress.EgressPolicy) -> None:
        self.policy = policy
        self._direct = limits.bounded_pools(
            egress.pool_manager(policy, num_pools=4, maxsize=POOL_SIZE, ca_certs=certifi.where()))
        self._proxies = {scheme: url for scheme, url in urllib.request.getproxies().items() if url}
        self._via_proxy: dict[str, urllib3.ProxyManager] = {}
        self._lock = threading.Lock()

    def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        data: Any = None,
        params: Mapping[str, Any] | None = None,
        auth: tuple[str, str] | None = None,
        verify: bool | str = True,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> HttpResponse:
        """One request, its whole answer read, all of it within `timeout` seconds and `max_bytes`
        of (decoded) answer. `json` is sent as JSON, `data` as a form (a mapping) or as it is
        (bytes, str); `auth` is HTTP Basic; `verify` a CA file, or False. Raises urllib3's errors
        (and EgressRefused, limits.AnswerTooLarge); `call` turns them into typed ones."""
        with limits.budget(timeout, max_bytes) as budget:
            return self._request(method, url, budget, headers=headers, json=json, data=data, params=params,
                                 auth=auth, verify=verify)

    def _request(self, method: str, url: str, budget: limits.Budget, *, headers: Mapping[str, str] | None,
                 json: Any, data: Any, params: Mapping[str, Any] | None, auth: tuple[str, str] | None,
                 verify: bool | str) -> HttpResponse:
        if params:
            query = urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
            url = f"{url}{'&' if '?' in url else '?'}{query}" if query else url
        head = urllib3.HTTPHeaderDict({"User-Agent": USER_AGENT, "Accept": "*/*",
                                       "Accept-Encoding": "gzip, deflate"})
        body: bytes | None = None
        if json is not None:
            body = jsonlib.dumps(json, allow_nan=False).encode("utf-8")
            head["Content-Type"] = "application/json"
        elif isinstance(data, (bytes, bytearray)):
            body = bytes(data)
        elif isinstance(data, str):
            body = data.encode("utf-8")
        elif data is not None:
            body = urlencode(data, doseq=True).encode("ascii")
            head["Content-Type"] = "application/x-www-form-urlencoded"
        if auth is not None:
            head["Authorization"] = "Basic " + b64encode(f"{auth[0]}:{auth[1]}".encode("utf-8")).decode("ascii")
        head.update(headers or {})
        # The budget bounds every recv and send (limits.bounded_pools); the connect gets what is left.
        left = budget.timeout()
        options: dict[str, Any] = {
            "body": body, "headers": head, "redirect": False, "retries": False,
            "timeout": urllib3.Timeout(connect=left, read=left), "preload_content": False,
        }
        tls: dict[str, Any] = {} if verify is True else (
            {"ca_certs": verify} if isinstance(verify, str) else {"cert_reqs": "CERT_NONE"})
        parsed = _parse(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise LocationValueError("not an http(s) URL with a host")
        proxy = self._proxy_for(parsed.scheme, parsed.host)
        if proxy is not None:
            # The proxy connects, not us: check the target's addresses before handing it over.
            self.policy.check_host(parsed.host)
            raw = self._proxy_manager(proxy, tls).urlopen(method, url, **options)
        else:
            pool = self._direct.connection_from_host(parsed.host, port=parsed.port, scheme=parsed.scheme,
                                                     pool_kwargs=tls or None)
            raw = pool.urlopen(method, parsed.request_uri, assert_same_host=False, **options)
        content = _read(raw, budget)
        text = content.decode(_charset(raw.headers.get("Content-Type", "")), errors="replace")
        try:
            parsed_body: Any = jsonlib.loads(text) if text else None
        except ValueError:
            parsed_body = None
        return HttpResponse(status=raw.status, headers=raw.headers, body=parsed_body, text=text, content=content,
                            reason=str(getattr(raw, "reason", None) or ""))

    def close(self) -> None:
        """Close every kept connection."""
        self._direct.clear()
        with self._lock:
            for manager in self._via_proxy.values():
                manager.clear()
            self._via_proxy.clear()

    def _proxy_for(self, scheme: str, host: str) -> str | None:
        if not self._proxies:
            return None
        proxy = self._proxies.get(scheme) or self._proxies.get("all")
        if proxy is None or urllib.request.proxy_bypass(host):
            return None
        return proxy

    def _proxy_manager(self, proxy: str, tls: dict[str, Any]) -> urllib3.ProxyManager:
        key = f"{proxy} {sorted(tls.items())}"
        with self._lock:
            manager = self._via_proxy.get(key)
            if manager is None:
                manager = self._via_proxy[key] = limits.bounded_pools(urllib3.ProxyManager(
                    proxy, num_pools=4, maxsize=POOL_SIZE, ca_certs=certifi.where(), **tls))
            return manager


@functools.lru_cache(maxsize=256)
def _parse(url: str) -> Url:
    """`parse_url`, kept per URL: a provider sends to the same few URLs (an account's endpoint),
    and parsing one again cost a send's call 2 % of its CPU (profiled)."""
    return parse_url(url)


def _read(raw: urllib3.BaseHTTPResponse, budget: limits.Budget) -> bytes:
    """The whole (decoded) body, counted against the budget's cap as it comes; a body past the cap,
    or a read that fails, closes the connection instead of handing it back with unread bytes."""
    chunks: list[bytes] = []
    try:
        length = raw.length_remaining
        if length is not None and length <= budget.max_bytes - budget.received and \
                raw.headers.get("Content-Encoding", "identity").lower() == "identity":
            # The common answer: its length said, within the cap, not compressed: one read of that length.
            chunks.append(raw.read(decode_content=True))
            budget.take(len(chunks[0]))
        else:
            for chunk in raw.stream(_CHUNK, decode_content=True):
                budget.take(len(chunk))
                chunks.append(chunk)
    except BaseException:
        raw.close()
        raise
    finally:
        raw.release_conn()
    return b"".join(chunks)


def _charset(content_type: str) -> str:
    """The charset a Content-Type names, if Python knows it; else UTF-8 (JSON's encoding)."""
    for part in content_type.split(";")[1:]:
        name, _, value = part.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"') or "utf-8"
            try:
                "".encode(charset)
            except LookupError:
                return "utf-8"
            return charset
    return "utf-8"


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
    client: Client,
    method: str,
    url: str,
    *,
    timeout: float,
    classify: Classifier | None = None,
    **kwargs: Any,
) -> HttpResponse:
    """Make one request (`kwargs` as `Client.request` takes them); return the response on 2xx,
    raise TransientError / PermanentError otherwise."""
    try:
        response = client.request(method, url, timeout=timeout, **kwargs)
    except ProviderError:  # EgressRefused: nothing was sent
        raise
    except limits.AnswerTooLarge:
        # The request went out and an answer came: the provider may have acted on it.
        raise TransientError("provider's answer is too large", code="provider_answer_too_large",
                             outcome_unknown=True) from None
    except NewConnectionError:  # before ConnectTimeoutError, which it subclasses
        raise TransientError("could not connect to the provider", code="connection_error") from None
    except ConnectTimeoutError:
        raise TransientError("could not reach the provider in time", code="connect_timeout") from None
    except Urllib3Timeout:
        # The request went out; the provider may have acted on it before we stopped waiting.
        raise TransientError("provider did not answer in time", code="timeout", outcome_unknown=True) from None
    except (ProtocolError, SSLError, ProxyError, OSError):
        raise TransientError("could not connect to the provider", code="connection_error") from None
    except (HTTPError, ValueError) as exc:
        raise TransientError(f"request failed ({type(exc).__name__})", code="request_error") from None
    if 200 <= response.status < 300:
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
