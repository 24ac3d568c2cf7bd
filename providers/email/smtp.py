"""SMTP provider: any relay (the clinic's own server, Gmail/Workspace, SES SMTP, Resend SMTP…).

Config keys (the channel's decrypted settings):
- `host`, `port` (default 587 for starttls, 465 for ssl, 25 for none)
- `security`: "starttls" (default) | "ssl" (implicit TLS) | "none"
- `username`, `password`: optional; when `username` is set we log in (after TLS)
- `from_email`, optional `from_name`
- `ca_file`: optional PEM to trust instead of the system store — a path, or the PEM text itself
  (self-signed test/internal relays). Hostnames are always checked.
- `helo_name`: optional EHLO name (default: the domain of `from_email`; avoids a slow getfqdn()).

The provider message id is the Message-ID we generate (with its angle brackets). It is derived from
the idempotency key, so a retry carries the same Message-ID; SMTP still has no idempotency, so
`honours_idempotency` is False.

Failures:
- a host that resolves to an internal address the egress policy refuses → permanent, `channel_broken`,
  code `egress_refused` (before any connection);
- connection refused/reset, DNS failure, timeout, 4xx replies (421/450/451/452…), server hang-up → transient;
- 5xx replies → permanent, code `smtp_<reply code>`; 5xx to MAIL FROM or the greeting, or 530
  (authentication required) → also `channel_broken` (every message would fail the same way);
- 535 and other refused logins → permanent, `channel_broken`, code `smtp_535` (a 454 login is transient);
- TLS: a certificate that does not verify, a server without STARTTLS, or a handshake that cannot
  agree (e.g. "ssl" against a STARTTLS port) will not fix itself → permanent, `channel_broken`;
  a TLS connection cut mid-handshake is a network failure → transient.
- A timeout or hang-up *after* the message body was sent (waiting for the final reply) is reported
  as transient with the distinct codes `timeout_after_data` / `disconnected_after_data`: the relay
  may have accepted the message, so a retry can deliver it twice.
- The send timeout is the whole conversation's, and the relay's replies are capped
  (`gateway.limits`): a relay that trickles its replies times out at it, and one that sends reply
  lines without end is cut off (`smtp_error`, or after the body `disconnected_after_data`).
"""

from __future__ import annotations

import re
import smtplib
import socket
import ssl
from typing import Literal

from gateway import egress, limits
from gateway.contract import (
    Health,
    OutboundMessage,
    Provider,
    SendResult,
    WebhookRequest,
    WebhookResult,
)
from gateway.errors import (
    MalformedWebhook,
    PermanentError,
    ProviderError,
    TransientError,
)
from providers.email import mime
from providers.email.fields import SMTP_FIELDS

Security = Literal["starttls", "ssl", "none"]
DEFAULT_PORTS = {"starttls": 587, "ssl": 465, "none": 25}
#: All the relay's replies of one conversation together (a few kB; EHLO's is the longest).
MAX_REPLY_BYTES = 256 * 1024
CRLF = b"\r\n"
_LINE_END = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"(?m)^\.")


class _AfterData(Exception):
    """The body went out; the failure happened while waiting for the final reply."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(type(cause).__name__)
        self.cause = cause


class SmtpProvider(Provider):
    """Sends one multipart/alternative message per call over a fresh SMTP connection."""

    name = "smtp"
    kinds = ("email",)
    credential_fields = SMTP_FIELDS
    checks_connection = True
    honours_idempotency = False

    # -- config -------------------------------------------------------------------------------

    def _security(self) -> Security:
        value = str(self.config.get("security") or "starttls").strip().lower()
        if value not in DEFAULT_PORTS:
            raise PermanentError("unknown smtp security mode", code="config_invalid", channel_broken=True)
        return value  # type: ignore[return-value]

    def _host_port(self, security: Security) -> tuple[str, int]:
        host = str(self.config.get("host") or "").strip()
        if not host:
            raise PermanentError("smtp host is not configured", code="config_missing", channel_broken=True)
        raw_port = self.config.get("port")
        try:
            port = int(raw_port) if raw_port not in (None, "") else DEFAULT_PORTS[security]
        except (TypeError, ValueError):
            raise PermanentError("smtp port is not a number", code="config_invalid", channel_broken=True) from None
        if not 0 < port < 65536:
            raise PermanentError("smtp port is out of range", code="config_invalid", channel_broken=True)
        return host, port

    def _tls_context(self) -> ssl.SSLContext:
        ca = self.config.get("ca_file")
        try:
            if isinstance(ca, str) and ca.strip():
                if "-----BEGIN" in ca:
                    context = ssl.create_default_context(cadata=ca)
                else:
                    context = ssl.create_default_context(cafile=ca.strip())
            else:
                context = ssl.create_default_context()
        except (OSError, ssl.SSLError, ValueError):
            raise PermanentError("ca_file cannot be loaded", code="config_invalid", channel_broken=True) from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context  # check_hostname=True, CERT_REQUIRED: create_default_context's defaults

    # -- send ---------------------------------------------------------------------------------

    def send(self, message: OutboundMessage) -> SendResult:
        security = self._security()
        host, port = self._host_port(security)
        from_email, from_name = mime.sender(self.config)
        parts = mime.prepare(message)
        domain = mime.sender_domain(from_email)
        msg_id = mime.message_id(domain, idempotency_key=message.idempotency_key,
                                 scope=f"{self.context.org_id}:{self.context.channel_id}")
        payload = mime.to_bytes(mime.build_mime(parts, from_email=from_email, from_name=from_name, msg_id=msg_id))
        tls = self._tls_context() if security != "none" else None
        try:
            self._deliver(security, host, port, tls, from_email, parts.to, payload, helo=self._helo(domain))
        except ProviderError:
            raise
        except _AfterData as exc:
            code = "timeout_after_data" if _is_timeout(exc.cause) else "disconnected_after_data"
            raise TransientError("no final reply after the message was sent (it may have been accepted)",
                                 code=code, outcome_unknown=True) from None
        except Exception as exc:  # noqa: BLE001 - mapped below, re-raised if unknown
            error = _map_exception(exc)
            if error is None:
                raise
            raise error from None
        return SendResult(provider_message_id=msg_id, provider_status="accepted")

    def check(self) -> Health:
        """Connect, greet, STARTTLS and log in exactly as a send does, then QUIT: nothing is sent.

        Raises the same typed errors as `send` (EgressRefused for an internal host, a refused
        login as PermanentError `smtp_535`, an unreachable server as TransientError)."""
        security = self._security()
        host, port = self._host_port(security)
        from_email, _name = mime.sender(self.config)
        tls = self._tls_context() if security != "none" else None
        try:
            self._deliver(security, host, port, tls, from_email, "", None,
                          helo=self._helo(mime.sender_domain(from_email)))
        except ProviderError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped below, re-raised if unknown
            error = _map_exception(exc)
            if error is None:
                raise
            raise error from None
        return Health(ok=True, state="ok")

    def _helo(self, domain: str) -> str:
        name = str(self.config.get("helo_name") or "").strip()
        return name or domain

    def _deliver(self, security: Security, host: str, port: int, tls: ssl.SSLContext | None,
                 from_email: str, to: str, payload: bytes | None, *, helo: str) -> None:
        timeout = float(self.context.timeout)
        # The timeout is the whole conversation's, and the relay's replies are capped (gateway.limits).
        with limits.budget(timeout, MAX_REPLY_BYTES):
            self._connect_and_converse(security, host, port, tls, from_email, to, payload, helo=helo,
                                       timeout=timeout)

    def _connect_and_converse(self, security: Security, host: str, port: int, tls: ssl.SSLContext | None,
                              from_email: str, to: str, payload: bytes | None, *, helo: str,
                              timeout: float) -> None:
        # The relay is a tenant-set address: the guard resolves it once, refuses internal
        # addresses (EgressRefused, before any connection) and connects to what it checked.
        policy = self.context.egress
        if security == "ssl":
            assert tls is not None
            client: smtplib.SMTP = egress.GuardedSMTP_SSL(host, port, local_hostname=helo, timeout=timeout,
                                                          context=tls, egress=policy)
        else:
            client = egress.GuardedSMTP(host, port, local_hostname=helo, timeout=timeout, egress=policy)
        try:
            self._converse(client, security, tls, from_email, to, payload)
        except BaseException:
            client.close()  # no QUIT: after a timeout it would only wait again
            raise
        try:
            client.quit()
        except Exception:  # noqa: BLE001 - the message was accepted; a failed QUIT changes nothing
            client.close()

    def _converse(self, client: smtplib.SMTP, security: Security, tls: ssl.SSLContext | None,
                  from_email: str, to: str, payload: bytes | None) -> None:
        _check(client.ehlo()[0], "ehlo")
        if security == "starttls":
            if not client.has_extn("starttls"):
                raise PermanentError("server does not offer STARTTLS", code="starttls_unsupported",
                                     channel_broken=True)
            try:
                client.starttls(context=tls)
            except smtplib.SMTPNotSupportedError:
                raise PermanentError("server does not offer STARTTLS", code="starttls_unsupported",
                                     channel_broken=True) from None
            except smtplib.SMTPResponseException as exc:
                _check(exc.smtp_code, "starttls")
            _check(client.ehlo()[0], "ehlo")
        username = self.config.get("username")
        if username:
            self._login(client, str(username), str(self.config.get("password") or ""))
        if payload is None:  # a connection check (`check`): greeted and logged in is the answer
            return
        # Addresses are ASCII here (IDNA domains; see mime.check_recipient): no SMTPUTF8 needed.
        _check(client.mail(from_email)[0], "mail")
        code = client.rcpt(to)[0]
        if code not in (250, 251):
            _check(code, "rcpt")
        self._data(client, payload)

    @staticmethod
    def _login(client: smtplib.SMTP, username: str, password: str) -> None:
        if not client.has_extn("auth"):
            raise PermanentError("server offers no authentication", code="auth_unsupported", channel_broken=True)
        try:
            client.login(username, password)
        except smtplib.SMTPAuthenticationError as exc:
            if 400 <= exc.smtp_code < 500:
                raise TransientError("login failed for now", code=f"smtp_{exc.smtp_code}") from None
            raise PermanentError("login refused", code=f"smtp_{exc.smtp_code}", channel_broken=True) from None
        except smtplib.SMTPNotSupportedError:
            raise PermanentError("server offers no authentication", code="auth_unsupported",
                                 channel_broken=True) from None
        except smtplib.SMTPException as exc:
            if isinstance(exc, smtplib.SMTPResponseException) or isinstance(exc, smtplib.SMTPServerDisconnected):
                raise
            # "No suitable authentication method found."
            raise PermanentError("no common authentication method", code="auth_unsupported",
                                 channel_broken=True) from None

    @staticmethod
    def _data(client: smtplib.SMTP, payload: bytes) -> None:
        """DATA, done by hand so a failure after the body went out can be told apart."""
        client.putcmd("data")
        code, _ = client.getreply()
        if code != 354:
            _check(code, "data")
        body = _LINE_END.sub(CRLF, payload)
        body = _LEADING_DOT.sub(b"..", body)  # RFC 5321 §4.5.2 dot-stuffing
        if not body.endswith(CRLF):
            body += CRLF
        client.send(body + b"." + CRLF)
        try:
            code, _ = client.getreply()
        except (smtplib.SMTPServerDisconnected, OSError, limits.AnswerTooLarge) as exc:
            raise _AfterData(exc) from None
        if code != 250:
            _check(code, "data_end")

    # -- webhooks -----------------------------------------------------------------------------

    def parse_webhook(self, request: WebhookRequest) -> WebhookResult:
        raise MalformedWebhook("smtp has no webhooks")


def _check(code: int, stage: str) -> None:
    """Raise the typed error for a non-success reply at `stage`."""
    if 200 <= code < 400:
        return
    raise _reply_error(code, stage)


def _reply_error(code: int, stage: str) -> ProviderError:
    label = f"smtp_{code}" if 100 <= code < 1000 else "smtp_bad_reply"
    if 400 <= code < 500:
        return TransientError(f"server deferred at {stage}", code=label)
    if 500 <= code < 600:
        broken = stage in ("greeting", "ehlo", "starttls", "mail") or code == 530
        return PermanentError(f"server refused at {stage}", code=label, channel_broken=broken)
    # -1 / garbage: smtplib's "connection unexpectedly closed" or an unparseable reply
    return TransientError(f"unexpected reply at {stage}", code=label)


def _map_exception(exc: BaseException) -> ProviderError | None:
    """Typed error for what smtplib/ssl/socket raised; None for anything else (a bug: re-raise)."""
    if isinstance(exc, smtplib.SMTPConnectError):  # greeting was not 220
        return _reply_error(exc.smtp_code, "greeting")
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return PermanentError("login refused", code=f"smtp_{exc.smtp_code}", channel_broken=True)
    if isinstance(exc, smtplib.SMTPRecipientsRefused):  # pragma: no cover - we call rcpt() directly
        return PermanentError("recipient refused", code="smtp_recipient_refused")
    if isinstance(exc, smtplib.SMTPResponseException):
        return _reply_error(exc.smtp_code, "reply")
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        if _is_timeout(exc):  # smtplib turns a read timeout into SMTPServerDisconnected
            return TransientError("smtp server did not answer in time", code="timeout")
        return TransientError("server closed the connection", code="disconnected")
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return PermanentError("server lacks a required extension", code="smtp_unsupported", channel_broken=True)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return PermanentError("server certificate does not verify", code="tls_certificate", channel_broken=True)
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLWantReadError, ssl.SSLWantWriteError)):
        return TransientError("TLS connection was cut", code="tls_interrupted")
    if isinstance(exc, ssl.SSLError):
        return PermanentError("TLS handshake failed", code="tls_error", channel_broken=True)
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return TransientError("smtp server did not answer in time", code="timeout")
    if isinstance(exc, ConnectionRefusedError):
        return TransientError("smtp server refused the connection", code="connection_refused")
    if isinstance(exc, socket.gaierror):
        return TransientError("smtp host does not resolve", code="dns_error")
    if isinstance(exc, OSError):
        return TransientError("could not talk to the smtp server", code="connection_error")
    if isinstance(exc, smtplib.SMTPException):
        return TransientError("smtp error", code="smtp_error")
    if isinstance(exc, UnicodeError):
        return PermanentError("address cannot be encoded", code="invalid_address")
    if isinstance(exc, limits.AnswerTooLarge):  # replies without end, before the message went out
        return TransientError("smtp server's replies are too long", code="smtp_error")
    return None


def _is_timeout(exc: BaseException | None) -> bool:
    """True when `exc` is, or was raised while handling, a socket timeout."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
