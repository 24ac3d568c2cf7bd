"""Conversation fields: what an org's flows may ask a patient for, declared once per org.

A field has a slug (the key its value takes in the run's `data`), a label, a type, the question
that asks for it (a pt-BR sentence, or one of the org's templates) and a harvest rule: `any_reply`
takes a value from whatever the patient writes, `when_asked` only from the answer to the field's
own question. A boolean is always `when_asked`: a stray "sim" must never open a gate. A value can be
copied onto the contact (`maps_to`, e.g. `contact.email`).

Every save is checked whole: a refusal (`FieldRejected`) lists each problem as a `Finding` on the
part of the input it is about, and nothing is written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from engine.core import clock
from engine.core.errors import DomainError
from engine.flows.versions import template_checker
from engine.store.models import conversation_fields
from engine.words.findings import Finding

FIELD_TYPES = ("text", "number", "date", "time", "period", "boolean", "choice", "phone", "email")
HARVEST = ("any_reply", "when_asked")
#: Types whose value can be read from any reply without its question being asked: they look like
#: nothing else ("sexta", "15h", "de manhã", an address). The others default to `when_asked`.
HARVESTABLE = frozenset({"date", "time", "period", "phone", "email"})
#: Where a value may be copied to, and the types that may go there.
MAPS_TO: Mapping[str, tuple[str, ...]] = {
    "contact.name": ("text",),
    "contact.email": ("email",),
}
SLUG = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
MAX_SLUG = 40
MAX_LABEL = 80
MAX_QUESTION = 500
MAX_OPTIONS = 20
MAX_OPTION = 80
#: Fields one org may declare: a bound on what a request can make the engine carry per turn.
MAX_FIELDS = 100
EDITABLE = ("slug", "label", "type", "options", "question", "template_key", "harvest", "maps_to")


@dataclass(frozen=True)
class Option:
    """One answer of a `choice` field: the value stored, and the label the patient reads."""

    value: str
    label: str


@dataclass(frozen=True)
class Field:
    """A declared field, as flows read it."""

    id: int
    slug: str
    label: str
    type: str
    question: str
    harvest: str
    options: tuple[Option, ...] = ()
    template_key: str | None = None
    maps_to: str | None = None

    @classmethod
    def of(cls, row: Any) -> "Field":
        """The field of a `conversation_fields` row."""
        options = tuple(Option(str(o["value"]), str(o["label"])) for o in (row.options or ()))
        return cls(id=row.id, slug=row.slug, label=row.label, type=row.type, question=row.question,
                   harvest=row.harvest, options=options, template_key=row.template_key, maps_to=row.maps_to)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, as the API and the CLI show it."""
        return {"id": self.id, "slug": self.slug, "label": self.label, "type": self.type, "question": self.question,
                "template_key": self.template_key, "harvest": self.harvest, "maps_to": self.maps_to,
                "options": [{"value": o.value, "label": o.label} for o in self.options]}


class FieldRejected(DomainError):
    """A field that cannot be saved as given; `findings` says each problem. Nothing was written."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        super().__init__(", ".join(f"{f.field}: {f.code}" for f in findings))
        self.findings = list(findings)


class FieldNotFound(DomainError):
    """No such field in the org (another org's field is not found either)."""


# --- reading ------------------------------------------------------------------------------------

def list_fields(conn: Connection, org_id: int) -> list[Field]:
    """The org's fields, by slug."""
    rows = conn.execute(select(conversation_fields).where(conversation_fields.c.org_id == org_id)
                        .order_by(conversation_fields.c.slug)).all()
    return [Field.of(row) for row in rows]


def get_field(conn: Connection, org_id: int, field_id: int) -> Field:
    """One of the org's fields by id; FieldNotFound otherwise."""
    row = conn.execute(select(conversation_fields).where(conversation_fields.c.org_id == org_id,
                                                         conversation_fields.c.id == field_id)).first()
    if row is None:
        raise FieldNotFound("no such field")
    return Field.of(row)


def fields_by_slug(conn: Connection, org_id: int, slugs: Sequence[str]) -> dict[str, Field]:
    """The org's fields among `slugs` (the ones that exist)."""
    if not slugs:
        return {}
    rows = conn.execute(select(conversation_fields).where(conversation_fields.c.org_id == org_id,
                                                          conversation_fields.c.slug.in_(list(slugs)))).all()
    return {row.slug: Field.of(row) for row in rows}


# --- checking -----------------------------------------------------------------------------------

def _text(value: Any, name: str, *, required: bool, max_chars: int, found: list[Finding]) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            found.append(Finding("detail_required", name))
        return None
    if not isinstance(value, str) or len(value.strip()) > max_chars:
        found.append(Finding("detail_text", name, {"max": max_chars}))
        return None
    return value.strip()


def _options(value: Any, kind: str | None, found: list[Finding]) -> list[dict[str, str]]:
    if kind != "choice":
        if value not in (None, []):
            found.append(Finding("field_options_only_choice", "options"))
        return []
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_OPTIONS:
        found.append(Finding("detail_list", "options", {"min": 2, "max": MAX_OPTIONS}))
        return []
    options: list[dict[str, str]] = []
    for item in value:
        if isinstance(item, str):
            item = {"value": item, "label": item}
        if not isinstance(item, dict) or set(item) - {"value", "label"}:
            found.append(Finding("field_option_shape", "options"))
            return []
        text = _text(item.get("value"), "options", required=True, max_chars=MAX_OPTION, found=found)
        label = _text(item.get("label", item.get("value")), "options", required=True, max_chars=MAX_OPTION,
                      found=found)
        if text is None or label is None:
            return []
        options.append({"value": text, "label": label})
    if len({o["value"].casefold() for o in options}) < len(options):
        found.append(Finding("detail_repeated", "options"))
    return options


def check(conn: Connection, org_id: int, data: Mapping[str, Any], *, field_id: int | None = None) -> dict[str, Any]:
    """The columns to write for `data` (a whole field), or FieldRejected listing every problem.

    `field_id` is the field being changed (its own slug is not a clash)."""
    found: list[Finding] = []
    unknown = sorted(set(data) - set(EDITABLE))
    for name in unknown:
        found.append(Finding("detail_unknown_field", str(name)[:MAX_SLUG]))
    slug = data.get("slug")
    if not isinstance(slug, str) or not SLUG.match(slug):
        found.append(Finding("detail_slug", "slug", {"max": MAX_SLUG}))
        slug = None
    label = _text(data.get("label"), "label", required=True, max_chars=MAX_LABEL, found=found)
    kind = data.get("type")
    if kind not in FIELD_TYPES:
        found.append(Finding("detail_choice", "type", {"choices": ", ".join(FIELD_TYPES)}))
        kind = None
    question = _text(data.get("question"), "question", required=True, max_chars=MAX_QUESTION, found=found)
    template_key = _text(data.get("template_key"), "template_key", required=False, max_chars=MAX_LABEL, found=found)
    if template_key is not None and not template_checker(conn, org_id)(template_key):
        found.append(Finding("unknown_template", "template_key", {"template": template_key, "field": "template_key"}))
    harvest = data.get("harvest")
    if harvest is None and kind is not None:
        harvest = "any_reply" if kind in HARVESTABLE else "when_asked"
    if harvest not in HARVEST:
        found.append(Finding("detail_choice", "harvest", {"choices": ", ".join(HARVEST)}))
    elif kind == "boolean" and harvest != "when_asked":
        found.append(Finding("field_boolean_when_asked", "harvest"))
    options = _options(data.get("options"), kind, found)
    maps_to = data.get("maps_to")
    if maps_to is not None:
        if maps_to not in MAPS_TO:
            found.append(Finding("detail_choice", "maps_to", {"choices": ", ".join(MAPS_TO)}))
        elif kind is not None and kind not in MAPS_TO[maps_to]:
            found.append(Finding("field_maps_to_type", "maps_to", {"target": maps_to, "types": ", ".join(MAPS_TO[maps_to])}))
    if slug is not None:
        clash = select(conversation_fields.c.id).where(conversation_fields.c.org_id == org_id,
                                                        conversation_fields.c.slug == slug)
        if field_id is not None:
            clash = clash.where(conversation_fields.c.id != field_id)
        if conn.execute(clash).first() is not None:
            found.append(Finding("field_slug_taken", "slug", {"slug": slug}))
    if found:
        raise FieldRejected(found)
    return {"slug": slug, "label": label, "type": kind, "question": question, "template_key": template_key,
            "harvest": harvest, "options": options, "maps_to": maps_to}


# --- writing ------------------------------------------------------------------------------------

def create_field(conn: Connection, org_id: int, data: Mapping[str, Any]) -> Field:
    """Declare a field; FieldRejected (nothing written) when `data` is not a whole, valid field."""
    count = conn.execute(select(func.count()).select_from(conversation_fields)
                         .where(conversation_fields.c.org_id == org_id)).scalar_one()
    if count >= MAX_FIELDS:
        raise FieldRejected([Finding("field_too_many", "", {"max": MAX_FIELDS})])
    values = check(conn, org_id, data)
    now = clock.now()
    field_id = conn.execute(insert(conversation_fields).values(org_id=org_id, created_at=now, updated_at=now, **values)
                            .returning(conversation_fields.c.id)).scalar_one()
    return get_field(conn, org_id, int(field_id))


def update_field(conn: Connection, org_id: int, field_id: int, changes: Mapping[str, Any]) -> Field:
    """Change some of a field's settings (the rest stay); checked whole, as `create_field`."""
    current = get_field(conn, org_id, field_id).as_dict()
    merged = {key: current[key] for key in EDITABLE} | dict(changes)
    if merged["type"] != current["type"]:
        # Another type brings its own default harvest, and options only when given again.
        for key in ("harvest", "options"):
            if key not in changes:
                merged[key] = None
    values = check(conn, org_id, merged, field_id=field_id)
    conn.execute(update(conversation_fields).where(conversation_fields.c.org_id == org_id,
                                                   conversation_fields.c.id == field_id)
                 .values(updated_at=clock.now(), **values))
    return get_field(conn, org_id, field_id)


def delete_field(conn: Connection, org_id: int, field_id: int) -> None:
    """Remove a field. Runs that collected it keep their values; a flow that still asks for it
    is refused at its next publish (its `ask` names an unknown field)."""
    done = conn.execute(delete(conversation_fields).where(conversation_fields.c.org_id == org_id,
                                                          conversation_fields.c.id == field_id))
    if done.rowcount == 0:
        raise FieldNotFound("no such field")
