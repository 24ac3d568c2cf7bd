"""An org's templates as the REST API and the CLI read and change them: the global defaults and the
org's own overrides, customising a default (the override starts as a copy of its texts and uses its
Meta mapping until given one of its own) and changing an override.

Each save checks the texts as the console's Modelos form does (they compile, and render on sample
data within the render's bounds) and reviews the Meta mapping (engine.messaging.meta_templates.review); a
refusal lists every finding and writes nothing. The WABA's list is read by the caller before the
saving transaction opens (`waba_for`, then `read_waba`): no transaction waits on Meta.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from sqlalchemy import insert, or_, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.messaging.meta_templates import (
    NO_MAPPING,
    MetaMapping,
    WabaList,
    default_of,
    effective,
    meta_channel,
    review,
)
from engine.store.models import CHANNEL_KINDS, templates
from engine.words.findings import Finding
from engine.messaging.render import SAMPLE_VARIABLES, TemplateError, render_html, render_text, validate

#: The purposes a template serves (the console's Modelos offers these).
TEMPLATE_KEYS = ("session_reminder", "session_confirmation", "session_cancellation", "confirm_ack", "cancel_ack",
                 "optout_confirmation", "conversation_reopen", "followup_checkin", "followup_rebook",
                 "followup_reply_ack")
LOCALES = ("pt_BR", "en", "es")
#: Sample data a template is checked and previewed with (never a patient's).
PREVIEW_VARIABLES = {**SAMPLE_VARIABLES, "link_descadastro": "https://exemplo.invalid/descadastro"}
TEXT_FIELDS = ("subject", "body", "body_html")


class TemplateNotFound(Exception):
    """No template with that id is the org's or a global default."""


class TemplateRefused(Exception):
    """A save that would write something broken; nothing was written."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(", ".join(f.code for f in findings))
        self.findings = findings


#: `Changes` field left out: the stored value stays.
UNSET: Any = object()


@dataclass(frozen=True)
class Changes:
    """What a save changes; a field left UNSET keeps its value. `meta=None` drops the template's own
    mapping (it uses its default's again)."""

    subject: Any = UNSET
    body: Any = UNSET
    body_html: Any = UNSET
    meta: Any = UNSET

    def given(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in (*TEXT_FIELDS, "meta") if getattr(self, name) is not UNSET}


@dataclass(frozen=True)
class Saved:
    """The template a save wrote, and what it should say (warnings) and record (changes)."""

    id: int
    created: bool
    changes: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[Finding, ...] = ()


def visible(conn: Connection, org_id: int) -> list[Any]:
    """The org's templates and the global defaults, by key, channel kind and language, the org's
    own before the default it overrides."""
    rows = conn.execute(select(templates).where(or_(templates.c.org_id == org_id, templates.c.org_id.is_(None)))).all()
    return sorted(rows, key=lambda r: (r.key, r.channel_kind, r.locale, r.org_id is None, r.id))


def find_visible(conn: Connection, org_id: int, template_id: int) -> Any:
    """The org's template or a global default with this id; TemplateNotFound for any other (another
    org's override included)."""
    row = conn.execute(select(templates).where(
        templates.c.id == template_id, or_(templates.c.org_id == org_id, templates.c.org_id.is_(None)))).first()
    if row is None:
        raise TemplateNotFound(template_id)
    return row


def mapping_of(conn: Connection, row: Any) -> tuple[MetaMapping | None, bool]:
    """(the Meta mapping `row` sends, whether it is its default's)."""
    return effective(row, default_of(conn, row))


def text_findings(values: Mapping[str, Any]) -> list[Finding]:
    """The texts' errors, as the console's form refuses them: a text that does not compile, a body
    that does not render on sample data, a subject or HTML body past the render's bounds."""
    found: list[Finding] = []
    for name in TEXT_FIELDS:
        source = values.get(name)
        if not source:
            continue
        try:
            validate(source)
            if name == "body":
                render_text(source, PREVIEW_VARIABLES)
            else:
                try:
                    (render_text if name == "subject" else render_html)(source, PREVIEW_VARIABLES)
                except TemplateError as exc:
                    if exc.whatever_the_data:
                        raise
        except TemplateError as exc:
            found.append(Finding("template_text_invalid", name, {"error": exc.text if exc.text is not None
                                                                 else str(exc)}))
    return found


def waba_for(conn: Connection, org_id: int, kind: str) -> Any:
    """The Meta channel whose WABA a save of a `kind` template must be checked against, or None."""
    return meta_channel(conn, org_id) if kind == "whatsapp" else None


def customize(conn: Connection, org_id: int, *, key: str, kind: str, locale: str, changes: Changes,
              waba: WabaList | None) -> Saved:
    """Create the org's own template for (key, kind, locale): the global default's texts where
    `changes` gives none, its mapping unless `changes.meta` gives one. TemplateRefused when the org
    already has one or the result would be broken."""
    if key not in TEMPLATE_KEYS or kind not in CHANNEL_KINDS or locale not in LOCALES:
        raise TemplateRefused([Finding("detail_invalid", "key")])
    exists = conn.execute(select(templates.c.id).where(
        templates.c.org_id == org_id, templates.c.key == key, templates.c.channel_kind == kind,
        templates.c.locale == locale)).first()
    if exists is not None:
        raise TemplateRefused([Finding("template_exists")])
    default = conn.execute(select(templates).where(
        templates.c.org_id.is_(None), templates.c.key == key, templates.c.channel_kind == kind,
        templates.c.locale == locale)).first()
    values = {name: getattr(default, name) if default is not None else None for name in TEXT_FIELDS}
    values.update({k: v for k, v in changes.given().items() if k != "meta"})
    if not values.get("body"):
        raise TemplateRefused([Finding("template_no_default", "body")])
    own = changes.meta if changes.meta is not UNSET else None
    warnings = _checked(conn, org_id, _Draft(key=key, channel_kind=kind), values, own, default, waba)
    now = clock.now()
    new_id = int(conn.execute(insert(templates).values(
        org_id=org_id, key=key, channel_kind=kind, locale=locale, updated_at=now,
        **values, **(own.columns() if own is not None else NO_MAPPING),
    ).returning(templates.c.id)).scalar_one())
    audit = {"key": key, "channel_kind": kind, "locale": locale, **_audited(changes.given())}
    return Saved(id=new_id, created=True, changes=audit, warnings=warnings)


def change(conn: Connection, org_id: int, template_id: int, changes: Changes, *, waba: WabaList | None) -> Saved:
    """Change the org's own template. TemplateNotFound for an id that is neither the org's nor a
    default; TemplateRefused for a global default (customise it first) or a broken result."""
    row = find_visible(conn, org_id, template_id)
    if row.org_id is None:
        raise TemplateRefused([Finding("template_default_read_only")])
    given = changes.given()
    values = {name: given.get(name, getattr(row, name)) for name in TEXT_FIELDS}
    if not values.get("body"):
        raise TemplateRefused([Finding("detail_required", "body")])
    own = changes.meta if changes.meta is not UNSET else MetaMapping.of(row)
    warnings = _checked(conn, org_id, row, values, own, default_of(conn, row), waba)
    write = {k: v for k, v in given.items() if k != "meta"}
    if changes.meta is not UNSET:
        write.update(own.columns() if own is not None else NO_MAPPING)
    if write:
        conn.execute(update(templates).where(templates.c.org_id == org_id, templates.c.id == row.id)
                     .values(**write, updated_at=clock.now()))
    return Saved(id=int(row.id), created=False, changes=_audited(given), warnings=warnings)


@dataclass(frozen=True)
class _Draft:
    """The fields `_checked` reads of a template not written yet."""

    key: str
    channel_kind: str


def _checked(conn: Connection, org_id: int, row: Any, values: Mapping[str, Any], own: MetaMapping | None,
             default: Any, waba: WabaList | None) -> tuple[Finding, ...]:
    """The warnings of a save; TemplateRefused with every error when it must not happen. Without a
    mapping of its own the template sends its default's (`default`, None when there is none)."""
    mapping = own if own is not None else MetaMapping.of(default) if default is not None else None
    result = review(row.key, row.channel_kind, mapping, own=own is not None,
                    on_meta=meta_channel(conn, org_id) is not None, waba=waba)
    errors = [*text_findings(values), *result.errors]
    if errors:
        raise TemplateRefused(errors)
    return result.warnings


def _audited(given: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in given.items() if k != "meta"}
    if "meta" in given:
        out["meta"] = given["meta"].as_dict() if given["meta"] is not None else None
    return out
