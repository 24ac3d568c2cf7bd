"""Turn an outbox row into the message a provider sends: pick the template (the org's override,
else the global default), build its variables, render it in the sandbox."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.engine import Connection

from engine.store.dialect import in_values
from engine.messaging.meta_templates import MetaMapping, effective, template_ref
from engine.store.models import templates
from engine.messaging.render import TemplateError, reminder_variables, render_html, render_text
from gateway.contract import Button, OutboundMessage, TemplateRef

#: Purposes whose WhatsApp message carries the Confirmar / Cancelar reply buttons inside the window
#: (outside it, the buttons are the approved template's, as its Meta mapping says).
PURPOSES_WITH_BUTTONS = ("session_reminder",)


class MissingAddress(Exception):
    """The contact has no phone or e-mail for the message's channel kind."""


@dataclass(frozen=True)
class RenderedMessage:
    """The provider-ready message and where it came from (for the logs view)."""

    outbound: OutboundMessage
    template_id: int | None


def find_template(conn: Connection, org_id: int, key: str, kind: str, locale: str) -> Any:
    """The org's template for (key, kind), preferring its own over the global default and the
    requested locale over pt_BR; None when neither exists. An override without a Meta mapping of its
    own carries its default's (engine.messaging.meta_templates)."""
    return find_templates(conn, {(org_id, key, kind, locale)})[(org_id, key, kind, locale)]


def find_templates(conn: Connection, wanted: set[tuple[int, str, str, str]]) -> dict[tuple[int, str, str, str], Any]:
    """`find_template` for many (org, key, kind, locale) at once, in one query."""
    if not wanted:
        return {}
    org_ids = sorted({w[0] for w in wanted})
    rows = conn.execute(
        select(templates).where(
            or_(in_values(conn, templates.c.org_id, org_ids), templates.c.org_id.is_(None)),
            in_values(conn, templates.c.key, sorted({w[1] for w in wanted})),
            in_values(conn, templates.c.channel_kind, sorted({w[2] for w in wanted})),
            in_values(conn, templates.c.locale, sorted({w[3] for w in wanted} | {"pt_BR"})),
        ).order_by(templates.c.id)
    ).all()
    found: dict[tuple[int, str, str, str], Any] = {}
    for org_id, key, kind, locale in wanted:
        candidates = [t for t in rows if t.org_id in (org_id, None) and t.key == key and t.channel_kind == kind
                      and t.locale in (locale, "pt_BR")]
        candidates.sort(key=lambda t: (t.org_id is None, t.locale != locale))
        found[(org_id, key, kind, locale)] = _with_default_mapping(candidates[0], rows) if candidates else None
    return found


def _with_default_mapping(row: Any, rows: list[Any]) -> Any:
    """`row`, or a copy of it with its global default's Meta mapping when it has none of its own
    (the default is among `rows`: they hold every global row of the keys, kinds and locales)."""
    if row.org_id is None or row.meta_template_name:
        return row
    default = next((t for t in rows if t.org_id is None and (t.key, t.channel_kind, t.locale)
                    == (row.key, row.channel_kind, row.locale)), None)
    mapping, inherited = effective(row, default)
    if not inherited or mapping is None:
        return row
    return SimpleNamespace(**{**row._mapping, **mapping.columns()})


#: `render_message(template=...)` default: look the template up.
LOOKUP: Any = object()


def message_variables(*, org: Any, contact: Any, appointment: Any, extra: dict[str, Any] | None) -> dict[str, object]:
    """Variables of a message: the appointment's when it has one, always the contact's and org's."""
    name = contact.name or ""
    if appointment is not None:
        variables = reminder_variables(
            contact_name=contact.name,
            professional=appointment.professional,
            starts_at=appointment.starts_at,
            timezone=appointment.timezone or org.timezone,
            mode=appointment.mode,
            location=appointment.location,
            org_name=org.name,
            locale=contact.locale or org.locale,
        )
    else:
        variables = {"nome": name.split()[0] if name.split() else "", "nome_completo": name, "clinica": org.name}
    if extra:
        variables.update({k: v for k, v in extra.items() if isinstance(k, str)})
    return variables


def render_message(
    conn: Connection,
    *,
    org: Any,
    contact: Any,
    appointment: Any,
    message: Any,
    conversation_open: bool = False,
    optout_url: str | None = None,
    template: Any = LOOKUP,
) -> RenderedMessage:
    """Render `message` for its channel kind; TemplateError or MissingAddress when it cannot be.

    `conversation_open` says the patient wrote in the last 24 hours (free text allowed on Meta);
    `optout_url` becomes the email's one-click `List-Unsubscribe` and the `link_descadastro`
    variable. A caller that read the template already (a batch, `find_templates`) passes it as
    `template` (None when there is none)."""
    kind = message.channel_kind
    to = contact.email if kind == "email" else contact.phone
    if not to:
        raise MissingAddress()
    payload = dict(message.payload or {})
    buttons: tuple[Button, ...] = ()
    reference: TemplateRef | None = None
    template_id = None
    if message.template_key is None:
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            raise TemplateError("message has neither a template nor text")
        subject = payload.get("subject") if isinstance(payload.get("subject"), str) else None
        html = None
    else:
        locale = contact.locale or org.locale
        if template is LOOKUP:
            template = find_template(conn, org.id, message.template_key, kind, locale)
        if template is None:
            raise TemplateError(f"no template {message.template_key!r} for {kind}")
        template_id = template.id
        try:
            variables = message_variables(org=org, contact=contact, appointment=appointment,
                                          extra=payload.get("variables"))
            variables["link_descadastro"] = optout_url or ""
        except ValueError as exc:
            raise TemplateError(str(exc)) from None
        text = render_text(template.body, variables)
        subject = render_text(template.subject, variables) if template.subject else None
        html = render_html(template.body_html, variables) if template.body_html else None
        written = payload.get("text")
        if isinstance(written, str) and written.strip():
            # AI-written text goes out as plain text (never rendered as a template); the template
            # stays the approved one Meta sends when its 24 h window has closed.
            text, html = written, None
        mapping = MetaMapping.of(template)
        if mapping is not None:
            reference = template_ref(mapping, variables, appointment.id if appointment is not None else None)
    if kind == "whatsapp" and appointment is not None and message.purpose in PURPOSES_WITH_BUTTONS:
        buttons = (Button(f"confirm:{appointment.id}", "Confirmar"), Button(f"cancel:{appointment.id}", "Cancelar"))
    headers: dict[str, str] = {}
    if kind == "email" and optout_url:
        headers = {"List-Unsubscribe": f"<{optout_url}>", "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}
    outbound = OutboundMessage(
        to=to,
        headers=headers,
        conversation_open=conversation_open,
        text=text,
        subject=subject,
        html=html,
        template=reference,
        buttons=buttons,
        idempotency_key=message.idempotency_key,
        reference=str(message.id),
    )
    return RenderedMessage(outbound=outbound, template_id=template_id)
