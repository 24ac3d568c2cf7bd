"""The egress guard: every outbound connection to an address a tenant typed goes through here.

A tenant sets a channel's `base_url`, an SMTP host, an agent's LLM URL. Unchecked, the web process
(test send, QR connect) and the workers (real sends) would connect wherever that points: loopback,
the private network, a cloud metadata address. So by default such an address may not resolve to
loopback, link-local (169.254/16, fe80::/10: metadata endpoints live there), private (RFC 1918,
fc00::/7), CGNAT (100.64/10), multicast, unspecified or reserved ranges, nor to an IPv6 address
that embeds one of those (IPv4-mapped, 6to4, Teredo, NAT64). Ops allow their own Evolution server
or SMTP relay with `LEMBRA_PROVIDER_ALLOW` (hosts and/or CIDRs, `engine.core.config`), which becomes an
`EgressPolicy`.

The check is made on the resolved addresses, at connect time, on every new connection: the name
is resolved once, every address it resolves to is checked, and the socket connects to one of
those checked addresses, never to the name again (so a DNS answer that changes between the check
and the connect — DNS rebinding — cannot slip loopback in). TLS still verifies the certificate
against the name. A refused address raises `EgressRefused` before any packet is sent to it, so
the answer is the same whether something listens there or not.

Three clients meet it:

- urllib3 (every HTTP provider, through `gateway.http.Client`): `pool_manager(policy)`, whose
  connections' `_new_conn` goes through `EgressPolicy.create_connection`;
- httpx / httpx2 (the `openai` package): `httpx_client(policy)`, a client whose transport's
  connection pool has a network backend that resolves, checks and connects to the checked address
  (and bounds each call by the thread's `gateway.limits` budget);
- smtplib: `GuardedSMTP` / `GuardedSMTP_SSL`, whose `_get_socket` does the same.

Redirects are never followed by these clients (and a redirect would go through the guard anyway).
"""

from __future__ import annotations

import ipaddress
import re
import smtplib
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.timeout import _DEFAULT_TIMEOUT

from gateway import limits
from gateway.errors import EgressRefused

__all__ = [
    "LOOPBACK",
    "STRICT",
    "EgressPolicy",
    "EgressRefused",
    "Endpoint",
    "GuardedSMTP",
    "GuardedSMTP_SSL",
    "InvalidAddress",
    "endpoint",
    "httpx_client",
    "is_internal",
    "pool_manager",
    "secrets_follow",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Refused on top of what `ipaddress` calls loopback / link-local / private / multicast /
#: unspecified / reserved / not global (spelled out so that a Python whose tables differ still
#: refuses them).
_REFUSED_NETWORKS: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(net) for net in (
    "0.0.0.0/8",          # "this network"
    "10.0.0.0/8",         # RFC 1918
    "100.64.0.0/10",      # CGNAT (RFC 6598)
    "127.0.0.0/8",        # loopback
    "169.254.0.0/16",     # link-local, cloud metadata (169.254.169.254)
    "172.16.0.0/12",      # RFC 1918
    "192.0.0.0/24",       # IETF protocol assignments
    "192.0.2.0/24",       # TEST-NET-1
    "192.88.99.0/24",     # 6to4 relay anycast
    "192.168.0.0/16",     # RFC 1918
    "198.18.0.0/15",      # benchmarking
    "198.51.100.0/24",    # TEST-NET-2
    "203.0.113.0/24",     # TEST-NET-3
    "224.0.0.0/4",        # multicast
    "240.0.0.0/4",        # reserved, broadcast
    "::/128",             # unspecified
    "::1/128",            # loopback
    "::/96",              # IPv4-compatible (deprecated)
    "::ffff:0:0/96",      # IPv4-mapped
    "64:ff9b:1::/48",     # local-use NAT64
    "100::/64",           # discard-only
    "2001:db8::/32",      # documentation
    "fc00::/7",           # unique local
    "fe80::/10",          # link-local
    "fec0::/10",          # site-local (deprecated)
    "ff00::/8",           # multicast
))
#: The NAT64 well-known prefix: its addresses carry an IPv4 address in their last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")


def _embedded(ip: IPAddress) -> list[IPAddress]:
    """`ip` and every IPv4 address an IPv6 address carries (where a router would take it)."""
    found: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            found.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            found.append(ip.sixtofour)
        if ip.teredo is not None:
            found.extend(ip.teredo)
        if ip in _NAT64:
            found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def is_internal(ip: IPAddress) -> bool:
    """True when a tenant-set address may not reach `ip` unless ops allow it."""
    for candidate in _embedded(ip):
        if (candidate.is_loopback or candidate.is_link_local or candidate.is_private or candidate.is_multicast
                or candidate.is_unspecified or candidate.is_reserved or not candidate.is_global):
            return True
        if any(candidate.version == net.version and candidate in net for net in _REFUSED_NETWORKS):
            return True
    return False


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _normal_host(host: str) -> str:
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".").lower()


@dataclass(frozen=True)
class EgressPolicy:
    """What a tenant-set address may reach beyond the public internet.

    `hosts`: names ops allow whatever they resolve to (their Evolution server, their relay);
    `networks`: CIDRs ops allow. The empty policy (`STRICT`) allows only public addresses.
    """

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> EgressPolicy:
        """Comma-separated hosts and/or CIDRs ("evolution, 10.0.0.0/8, ::1"); raise ValueError
        with a one-line reason for anything else (a port, a URL, a wildcard)."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for raw in (text or "").split(","):
            entry = raw.strip()
            if not entry:
                continue
            bare = entry[1:-1] if entry.startswith("[") and entry.endswith("]") else entry
            try:
                network = ipaddress.ip_network(bare, strict=False)
            except ValueError:
                network = None
            if network is not None:
                if network not in networks:
                    networks.append(network)
                continue
            name = _normal_host(entry)
            if not _HOSTNAME.fullmatch(name) or name.replace(".", "").isdigit():
                raise ValueError(f"not a host name or CIDR: {entry!r} (no scheme, port or wildcard)")
            hosts.add(name)
        return cls(hosts=frozenset(hosts), networks=tuple(networks))

    def __str__(self) -> str:
        return ",".join([*sorted(self.hosts), *(str(net) for net in self.networks)])

    # -- the check ------------------------------------------------------------------------------

    def allows_host(self, host: str) -> bool:
        """True when ops allowed this name as such (what it resolves to is then not checked)."""
        return _normal_host(host) in self.hosts

    def allows_ip(self, ip: IPAddress) -> bool:
        """True when a tenant-set address may connect to `ip`."""
        if any(ip.version == net.version and ip in net for net in self.networks):
            return True
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            mapped = ip.ipv4_mapped  # ::ffff:10.0.0.5 is 10.0.0.5 when 10.0.0.0/8 is allowed
            if any(net.version == 4 and mapped in net for net in self.networks):
                return True
        return not is_internal(ip)

    def resolve(self, host: str, port: int | str | None) -> list[tuple[Any, ...]]:
        """`getaddrinfo(host, port)` for TCP, done once, every address checked.

        Raises EgressRefused when any address is refused (a name that resolves to one public and
        one internal address is refused: which one a client would use is not ours to pick), and
        socket.gaierror when the name does not resolve. Connect only to what this returns.
        """
        name = _normal_host(host or "")
        if not name:
            raise EgressRefused(host or "")
        infos = socket.getaddrinfo(name, port, 0, socket.SOCK_STREAM)
        if self.allows_host(name):
            return list(infos)
        for info in infos:
            address = info[4][0]
            ip = _ip(address.split("%", 1)[0]) if isinstance(address, str) else None
            if ip is None or not self.allows_ip(ip):
                raise EgressRefused(host)
        return list(infos)

    def create_connection(
        self,
        address: tuple[str, int],
        timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
        source_address: tuple[str, int] | None = None,
        socket_options: Iterable[tuple[int, int, int]] | None = None,
    ) -> socket.socket:
        """`socket.create_connection`, but to the addresses `resolve` checked (and nowhere else)."""
        host, port = address
        error: OSError | None = None
        for family, socktype, proto, _canonname, sockaddr in self.resolve(host, port):
            sock = None
            try:
                sock = socket.socket(family, socktype, proto)
                for option in socket_options or ():
                    sock.setsockopt(*option)
                if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                error = exc
                if sock is not None:
                    sock.close()
        if error is not None:
            try:
                raise error
            finally:
                error = None
        raise OSError("getaddrinfo returns an empty list")

    # -- at save time ---------------------------------------------------------------------------

    def check_host(self, host: str) -> None:
        """Raise EgressRefused when `host` resolves (now) to a refused address.

        For forms, before anything is stored. A name that does not resolve today passes: the
        check at connect time is the one that holds.
        """
        try:
            self.resolve(host, None)
        except (OSError, UnicodeError):
            pass

    def check_url(self, url: str) -> Endpoint:
        """`check_host` for the host of `url` as the HTTP clients will read it (`endpoint`), which it
        returns; raise InvalidAddress for a URL they could not use, or could read differently.

        A refused URL that some reading points inside the network (the resolver takes an octal or
        short IPv4 address as an address; after a `user@` comes where the client would go) is said
        to be an internal address (EgressRefused), the reason that matters more."""
        try:
            where = endpoint(url)
        except InvalidAddress as exc:
            host = _read_anyway(url) if exc.code in ("url_ip_spelling", "url_credentials") else None
            if host:
                self.check_host(host)
            raise
        self.check_host(where.host)
        return where


# -------------------------------------------------------------------------------- endpoints


def check_saved_url(url: str, policy: EgressPolicy | None) -> Endpoint:
    """A URL a tenant typed, as it is saved: one the HTTP clients can use (`endpoint`, else
    InvalidAddress) and, with the process's `policy`, whose host does not resolve inside the
    network now (EgressRefused). Without a policy only the connect-time guard applies, which
    refuses the address again at every call: that is the check that holds."""
    return endpoint(url) if policy is None else policy.check_url(url)


class InvalidAddress(ValueError):
    """A tenant-set URL that Lembra will not use; `code` is the catalogue's: url_invalid (not an
    http(s) URL with a host it can read), url_credentials (a user or password in it), url_ip_spelling
    (an IPv4 address written another way than four decimal numbers)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class Endpoint:
    """Where an http(s) URL connects: its scheme, host and port (the scheme's default when none is
    written). What a credential is bound to: the same key sent to another endpoint is a key given
    away (see `same_endpoint`)."""

    scheme: str
    host: str
    port: int


_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<rest>[/?#].*)?", re.DOTALL)
_PORT = re.compile(r"[0-9]{1,5}")
#: A label of inet_aton's numbers (decimal, octal with a leading 0, hex with 0x): a host made only
#: of these is an IPv4 address to the resolver, whatever it looks like.
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def endpoint(url: str) -> Endpoint:
    """The endpoint of a tenant-set URL: the one parse behind every decision about it (the egress
    check at save time, the forms, which credentials it may keep).

    It accepts only what urllib3 (the providers), httpx (the LLM client) and the resolver all read
    the same way, so that what is checked is where the client connects: http or https, a host that
    is a DNS name in ASCII, a dotted-quad IPv4 address or a bracketed IPv6 address, an optional
    port. Refused, with InvalidAddress: a user or password (a percent-encoded `@` included), a
    backslash, spaces or control characters, percent-encoding in the host, an IPv4 address spelled
    in octal, hex or fewer than four parts (http://0177.0.0.1/), a port outside 1-65535.
    """
    text = (url or "").strip()
    if not text or "\\" in text or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise InvalidAddress("url_invalid")
    match = _URL.fullmatch(text)
    if match is None or match["scheme"].lower() not in _DEFAULT_PORTS:
        raise InvalidAddress("url_invalid")
    scheme, authority = match["scheme"].lower(), match["authority"]
    if "@" in authority or "%40" in authority.lower():
        raise InvalidAddress("url_credentials")
    if authority.startswith("["):
        inside, bracket, after = authority[1:].partition("]")
        try:
            ip = ipaddress.IPv6Address(inside) if bracket and "%" not in inside else None
        except ValueError:
            ip = None
        if ip is None or (after and not after.startswith(":")):
            raise InvalidAddress("url_invalid")
        host, port_text = str(ip), (after[1:] if after else None)
    else:
        host, colon, port_text_or_empty = authority.partition(":")
        host, port_text = host.lower(), (port_text_or_empty if colon else None)
        if not host.isascii() or not _HOSTNAME.fullmatch(host.rstrip(".") or "-"):
            raise InvalidAddress("url_invalid")
        if all(_NUMBER.fullmatch(label) for label in host.rstrip(".").split(".")):
            ip4 = _ip(host)
            if not isinstance(ip4, ipaddress.IPv4Address) or str(ip4) != host:
                raise InvalidAddress("url_ip_spelling")
    if port_text is None:
        port = _DEFAULT_PORTS[scheme]
    elif _PORT.fullmatch(port_text) and 1 <= int(port_text) <= 65535:
        port = int(port_text)
    else:
        raise InvalidAddress("url_invalid")
    return Endpoint(scheme, host, port)


def _read_anyway(url: str) -> str | None:
    """The host of a URL `endpoint` refused for its spelling or its userinfo, as a lenient reader
    takes it: after the last `@` (a percent-encoded one included), without the port."""
    match = _URL.fullmatch((url or "").strip())
    if match is None:
        return None
    authority = re.sub("%40", "@", match["authority"], flags=re.IGNORECASE).rsplit("@", 1)[-1]
    if authority.startswith("["):
        return authority[1:].partition("]")[0] or None
    return authority.partition(":")[0] or None


def secrets_follow(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether the secrets stored with some settings may stay when they change from `before` to
    `after`: the one rule for every credential bound to an address (an agent's LLM key, a
    channel's API key, token or password). They stay only while every value that says where they
    are sent points where it pointed: a URL to the same scheme, host and port (`endpoint`: the
    security boundary — another host is another party, another port on a shared host may be
    another tenant's service, and http instead of https hands the key to the network path), any
    other value (an SMTP host, port, security) the same but for case and blanks. Otherwise an
    editor could point the settings at a server of their own and have Lembra send it the key."""
    for key in before.keys() | after.keys():
        old, new = _setting(before.get(key)), _setting(after.get(key))
        if old == new:
            continue
        try:
            if old and new and endpoint(old) == endpoint(new):
                continue
        except InvalidAddress:
            pass
        if old.lower() != new.lower():
            return False
    return True


def _setting(value: Any) -> str:
    return "" if value is None else str(value).strip()


#: Only public addresses: what a tenant-set address gets unless ops configure otherwise.
STRICT = EgressPolicy()
#: Loopback only: the embedded default (`lembra up`) and the test suite's fakes.
LOOPBACK = EgressPolicy.parse("127.0.0.0/8,::1/128")


# ------------------------------------------------------------------------------------ urllib3


class _GuardedConnectionMixin:
    """urllib3's `_new_conn` with the policy's resolve → check → connect instead of DNS + connect."""

    egress_policy: EgressPolicy
    host: str
    port: int
    timeout: Any
    source_address: Any
    socket_options: Any
    _dns_host: str

    def _new_conn(self) -> socket.socket:
        default = socket._GLOBAL_DEFAULT_TIMEOUT  # type: ignore[attr-defined]
        timeout = default if self.timeout is _DEFAULT_TIMEOUT else self.timeout
        try:
            sock = self.egress_policy.create_connection(
                (self._dns_host, self.port), timeout,
                source_address=self.source_address, socket_options=self.socket_options,
            )
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc  # type: ignore[arg-type]
        except TimeoutError as exc:  # socket.timeout
            raise ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})") from exc
        except OSError as exc:
            message = f"Failed to establish a new connection: {exc}"
            raise NewConnectionError(self, message) from exc  # type: ignore[arg-type]
        sys.audit("http.client.connect", self, self.host, self.port)
        return sock


@lru_cache(maxsize=64)
def _pool_classes(policy: EgressPolicy) -> dict[str, type]:
    http_conn = type("GuardedHTTPConnection", (_GuardedConnectionMixin, HTTPConnection), {"egress_policy": policy})
    https_conn = type("GuardedHTTPSConnection", (_GuardedConnectionMixin, HTTPSConnection), {"egress_policy": policy})
    return {
        "http": type("GuardedHTTPConnectionPool", (HTTPConnectionPool,), {"ConnectionCls": http_conn}),
        "https": type("GuardedHTTPSConnectionPool", (HTTPSConnectionPool,), {"ConnectionCls": https_conn}),
    }


def pool_manager(policy: EgressPolicy, **kwargs: Any) -> PoolManager:
    """A urllib3 PoolManager (`kwargs` are its own) whose every new connection, redirected ones
    included, goes to an address `policy` checked. `gateway.http.Client` (every HTTP provider)
    sends through one; the guard is in the pools, so no caller can forget it."""
    manager = PoolManager(**kwargs)
    manager.pool_classes_by_scheme = _pool_classes(policy)
    return manager


# -------------------------------------------------------------------------------------- httpx


def _httpx_modules() -> tuple[Any, Any]:
    """(httpx, httpcore) as the installed `openai` uses them: httpx2 (openai 3) or httpx."""
    try:
        import httpcore2
        import httpx2
        return httpx2, httpcore2
    except ImportError:
        import httpcore
        import httpx
        return httpx, httpcore


@lru_cache(maxsize=2)
def _backend_class(httpcore: Any) -> type:
    class EgressBackend(httpcore.SyncBackend):  # type: ignore[misc,name-defined]
        """httpcore's socket backend, connecting only to addresses the policy checked."""

        def __init__(self, policy: EgressPolicy) -> None:
            super().__init__()
            self.egress_policy = policy

        def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                        local_address: str | None = None,
                        socket_options: Iterable[Any] | None = None) -> Any:
            try:
                infos = self.egress_policy.resolve(host, port)
            except (OSError, UnicodeError) as exc:
                raise httpcore.ConnectError(str(exc)) from exc
            last: Exception | None = None
            for info in infos:
                try:
                    # An IP literal: connect_tcp's own getaddrinfo does no DNS. TLS's
                    # server_hostname is the request's host, set by the connection, not this.
                    return super().connect_tcp(info[4][0], port, timeout=timeout, local_address=local_address,
                                               socket_options=socket_options)
                except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                    last = exc
            if last is not None:
                raise last
            raise httpcore.ConnectError("getaddrinfo returns an empty list")

    return EgressBackend


def httpx_client(policy: EgressPolicy, *, timeout: float | None = None) -> Any:
    """An httpx(2).Client for tenant-set URLs (pass it to `openai.OpenAI(http_client=…)`):
    every connection is checked by `policy`, redirects are not followed, no proxy or netrc from
    the environment. A call made inside a `gateway.limits.budget` ends at its deadline and its
    size cap; answers come uncompressed (one that comes compressed anyway is refused before it is
    decoded), so the cap on the bytes read is a cap on the answer."""
    httpx, httpcore = _httpx_modules()
    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.ConnectionPool) or not hasattr(pool, "_network_backend"):
        raise RuntimeError("this httpx version cannot be guarded: its transport has no connection pool backend")
    pool._network_backend = limits.BoundedBackend(_backend_class(httpcore)(policy), httpcore)
    return httpx.Client(transport=transport, follow_redirects=False, trust_env=False,
                        headers={"Accept-Encoding": "identity"},
                        event_hooks={"request": [], "response": [limits.refuse_encoded]},
                        **({"timeout": timeout} if timeout is not None else {}))


# ------------------------------------------------------------------------------------- smtplib


@contextmanager
def _closed_on_failure(client: smtplib.SMTP) -> Iterator[None]:
    """Close `client` if its constructor fails: smtplib connects there, then reads the greeting,
    and leaves the socket open when that read fails (a timeout, a greeting cut off at the cap)."""
    try:
        yield
    except BaseException:
        client.close()
        raise


class GuardedSMTP(smtplib.SMTP):
    """smtplib.SMTP whose connection goes to an address `egress` checked, and whose conversation,
    inside a `gateway.limits.budget`, ends at its deadline and reads at most its cap of replies (a
    relay that trickles a reply, or sends continuation lines without end, is cut off)."""

    egress_policy: EgressPolicy

    def __init__(self, *args: Any, egress: EgressPolicy, **kwargs: Any) -> None:
        self.egress_policy = egress  # before SMTP.__init__, which connects when given a host
        with _closed_on_failure(self):
            super().__init__(*args, **kwargs)

    def _get_socket(self, host: str, port: int, timeout: Any) -> socket.socket:
        if timeout is not None and not timeout:
            raise ValueError("Non-blocking socket (timeout=0) is not supported")
        return self.egress_policy.create_connection((host, port), timeout, self.source_address)

    def getreply(self) -> tuple[int, bytes]:
        if self.file is None and self.sock is not None:  # a new connection, or TLS just started
            self.file = limits.reader(self.sock)
        return super().getreply()

    def send(self, s: Any) -> None:
        limits.bound_socket(self.sock)
        super().send(s)


class GuardedSMTP_SSL(smtplib.SMTP_SSL, GuardedSMTP):
    """smtplib.SMTP_SSL (implicit TLS, certificate checked against the host name) whose
    connection goes to an address `egress` checked (MRO: SMTP_SSL's wrap over GuardedSMTP's socket)."""

    def __init__(self, *args: Any, egress: EgressPolicy, **kwargs: Any) -> None:
        self.egress_policy = egress
        with _closed_on_failure(self):
            smtplib.SMTP_SSL.__init__(self, *args, **kwargs)

