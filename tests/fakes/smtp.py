"""A real SMTP server on loopback (aiosmtpd) for the SMTP provider's tests.

`FakeSmtpServer(security=...)` speaks plain SMTP, STARTTLS (required before MAIL) or implicit TLS,
optionally demands AUTH, and can be scripted to answer MAIL / RCPT / end-of-DATA with any reply
(e.g. "550 5.1.1 mailbox unavailable", "451 4.3.0 try later") or to stall before the final reply.
Every accepted message is kept (envelope + raw bytes) so tests assert on what went over the wire.

`make_certificate(tmp_path)` writes a self-signed certificate for 127.0.0.1/localhost (made with
`cryptography`) that the provider trusts through its `ca_file` setting.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import socket
import ssl
import threading
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Certificate:
    cert_path: Path
    key_path: Path

    @property
    def pem(self) -> str:
        return self.cert_path.read_text()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_path, self.key_path)
        return context


def make_certificate(directory: Path, common_name: str = "localhost",
                     names: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = (HOST,)) -> Certificate:
    """A self-signed server certificate (EC P-256) valid for `names` and `ips`, written as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.timezone.utc)
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{common_name}-{x509.random_serial_number() % 10**8}"
    cert_path = directory / f"{stem}.crt"
    key_path = directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Certificate(cert_path, key_path)


@dataclass
class Received:
    """One message the server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    raw: bytes
    mail_options: list[str]
    authenticated_as: str | None
    tls: bool

    @property
    def message(self) -> EmailMessage:
        return message_from_bytes(self.raw, policy=policy.default)  # type: ignore[return-value]


@dataclass
class Script:
    """Scripted answers; None means the normal 250."""

    mail_reply: str | None = None
    rcpt_reply: str | None = None
    data_reply: str | None = None
    data_delay: float = 0.0


class _Handler:
    def __init__(self, server: "FakeSmtpServer") -> None:
        self.server = server

    async def handle_MAIL(self, server: SMTP, session: Session, envelope: Envelope, address: str,
                          mail_options: list[str]) -> str:
        if self.server.script.mail_reply:
            return self.server.script.mail_reply
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope, address: str,
                          rcpt_options: list[str]) -> str:
        if self.server.script.rcpt_reply:
            return self.server.script.rcpt_reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        script = self.server.script
        if script.data_delay:
            await asyncio.sleep(script.data_delay)
        if script.data_reply:
            return script.data_reply
        raw = envelope.original_content or b""
        login = session.auth_data.login.decode() if isinstance(session.auth_data, LoginPassword) else None
        with self.server.lock:
            self.server.received.append(Received(
                mail_from=str(envelope.mail_from), rcpt_tos=list(envelope.rcpt_tos), raw=raw,
                mail_options=list(envelope.mail_options), authenticated_as=login,
                tls=server.transport is not None and server.transport.get_extra_info("ssl_object") is not None,
            ))
        return "250 2.0.0 Ok: queued"


class _Controller(Controller):
    """Controller on an ephemeral port (port=0): learn the real port before the self-test connect."""

    def _trigger_server(self) -> None:
        assert self.server is not None
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


@dataclass
class FakeSmtpServer:
    """`with FakeSmtpServer(security="starttls", certificate=cert) as smtp:` then `smtp.port`."""

    security: str = "none"  # "none" | "starttls" | "ssl"
    certificate: Certificate | None = None
    users: dict[str, str] | None = None  # AUTH required when set
    script: Script = field(default_factory=Script)
    received: list[Received] = field(default_factory=list)
    auth_attempts: list[tuple[str, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _authenticator(self, server: SMTP, session: Session, envelope: Envelope, mechanism: str,
                       auth_data: Any) -> AuthResult:
        if not isinstance(auth_data, LoginPassword) or self.users is None:
            return AuthResult(success=False, handled=False)
        login, password = auth_data.login.decode(), auth_data.password.decode()
        ok = self.users.get(login) == password
        with self.lock:
            self.auth_attempts.append((login, ok))
        return AuthResult(success=ok, handled=False, auth_data=auth_data)

    def __enter__(self) -> "FakeSmtpServer":
        kwargs: dict[str, Any] = {"hostname": HOST, "port": 0, "ready_timeout": 5.0,
                                  "server_hostname": "fake-smtp.test"}
        if self.security in ("starttls", "ssl"):
            assert self.certificate is not None, "TLS modes need a certificate"
            context = self.certificate.server_context()
            if self.security == "starttls":
                kwargs.update(tls_context=context, require_starttls=True)
            else:
                kwargs.update(ssl_context=context)
        if self.users is not None:
            kwargs.update(authenticator=self._authenticator, auth_required=True,
                          auth_require_tls=self.security != "none")
        self._controller = _Controller(_Handler(self), **kwargs)
        self._controller.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._controller.stop()

    @property
    def port(self) -> int:
        return int(self._controller.port)


def free_port() -> int:
    """A port nothing listens on (bound then released): connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class SilentServer:
    """Accepts TCP connections and never says a word (an SMTP greeting that never comes)."""

    def __enter__(self) -> "SilentServer":
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((HOST, 0))
        self._sock.listen(8)
        return self

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: Any) -> None:
        self._sock.close()
