"""`lembra fields …`: the conversation fields an org's flows may ask a patient for
(engine/flows/conversation/fields.py). A refused save prints every problem as the catalogue's
sentence and exits 1, nothing written; the same checks as the REST API's."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from admin.cli.common import fail, load_runtime, org_of
from engine.flows.conversation.fields import FIELD_TYPES, HARVEST, MAPS_TO


def _option(text: str) -> dict[str, str]:
    value, _, label = text.partition("=")
    return {"value": value.strip(), "label": (label or value).strip()}


@click.group("fields", help="Conversation fields: what an org's flows may ask a patient for (a date, a period of the "
                            "day, a choice…), declared once per org.")
def fields_group() -> None:
    """Field commands."""


@fields_group.command("list", help="List the org's fields.")
@click.option("--org", "org_slug", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def fields_list(org_slug: str, as_json: bool) -> None:
    from engine.flows.conversation.fields import list_fields

    rt = load_runtime()
    with rt.db.connect() as conn:
        found = list_fields(conn, org_of(conn, org_slug).id)
    if as_json:
        click.echo(json.dumps([f.as_dict() for f in found], ensure_ascii=False, indent=2))
        return
    if not found:
        click.echo("no fields")
    for f in found:
        options = f" [{', '.join(o.label for o in f.options)}]" if f.options else ""
        click.echo(f"{f.slug:<24} {f.type:<8} {f.harvest:<10} {f.label}{options}: {f.question}")


@fields_group.command("add", help="Declare a field. A choice takes --option VALUE or VALUE=LABEL, once per option.")
@click.option("--org", "org_slug", required=True)
@click.option("--slug", required=True, help="The key of the value in a run's data (a-z, 0-9, _).")
@click.option("--label", required=True)
@click.option("--type", "kind", required=True, type=click.Choice(FIELD_TYPES))
@click.option("--question", required=True, help="The sentence that asks for it.")
@click.option("--option", "options", multiple=True)
@click.option("--harvest", type=click.Choice(HARVEST), help="By default any_reply for date, time, period, phone and "
                                                            "email; when_asked for the others.")
@click.option("--maps-to", type=click.Choice(tuple(MAPS_TO)))
@click.option("--template", "template_key", help="A template sent instead of the question when one is needed.")
def fields_add(org_slug: str, slug: str, label: str, kind: str, question: str, options: tuple[str, ...],
               harvest: str | None, maps_to: str | None, template_key: str | None) -> None:
    from engine.flows.conversation.fields import FieldRejected, create_field

    data: dict[str, Any] = {"slug": slug, "label": label, "type": kind, "question": question,
                            "harvest": harvest, "maps_to": maps_to, "template_key": template_key}
    if options:
        data["options"] = [_option(o) for o in options]
    rt = load_runtime()
    try:
        with rt.db.begin() as conn:
            field = create_field(conn, org_of(conn, org_slug).id, data)
    except FieldRejected as exc:
        click.echo("lembra: not saved:\n" + "\n".join(f"  {f.field or '-'}: {f.text}" for f in exc.findings), err=True)
        sys.exit(1)
    click.echo(f"field {field.slug} declared (id {field.id}, {field.type}, {field.harvest})")


@fields_group.command("remove", help="Remove a field by its slug.")
@click.option("--org", "org_slug", required=True)
@click.argument("slug")
def fields_remove(org_slug: str, slug: str) -> None:
    from engine.flows.conversation.fields import delete_field, fields_by_slug

    rt = load_runtime()
    with rt.db.begin() as conn:
        org = org_of(conn, org_slug)
        found = fields_by_slug(conn, org.id, [slug]).get(slug)
        if found is None:
            fail(f"{org_slug} has no field {slug}")
        delete_field(conn, org.id, found.id)
    click.echo(f"field {slug} removed")
