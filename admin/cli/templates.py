"""`lembra templates …`: an org's message templates and the global defaults, each with the approved
Meta template it sends outside WhatsApp's 24-hour window (engine/messaging/meta_templates.py); map a template
to one of the clinic's WABA, change its texts, list the WABA's templates.

Saves go through engine/messaging/template_edits (as the REST API's): a refusal prints every problem as the
catalogue's sentence and exits 1, nothing written; a Meta outage prints a warning and saves."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from admin.cli.common import fail, load_runtime, org_of


def _mapping_line(mapping: Any, inherited: bool) -> str:
    if mapping is None:
        return "-"
    line = f"{mapping.name} ({mapping.language}): {', '.join(mapping.parameters) or 'no variables'}"
    if mapping.buttons:
        line += f" [{', '.join(mapping.buttons)}]"
    return line + (" (the default's)" if inherited else "")


def _findings(findings: Any) -> str:
    from engine.messaging.template_edits import TEXT_FIELDS

    def where(part: str) -> str:
        return part if part in TEXT_FIELDS or part == "key" else f"meta.{part}" if part else "meta"

    return "\n".join(f"  {where(f.field)}: {f.text}" for f in findings)


@click.group("templates", help="Message templates and the approved Meta template each sends outside WhatsApp's "
                               "24-hour window (its name, language, the Lembra variables of its {{1}}, {{2}}… in "
                               "order, and its quick-reply buttons). A clinic's own template uses the mapping of the "
                               "default it customises until it is given its own.")
def templates_group() -> None:
    """Template commands."""


@templates_group.command("list", help="List the org's templates and the global defaults with their Meta mapping.")
@click.option("--org", "org_slug", required=True)
def templates_list(org_slug: str) -> None:
    from engine.messaging import meta_templates, template_edits

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = org_of(conn, org_slug)
        rows = template_edits.visible(conn, org.id)
    defaults = {(r.key, r.channel_kind, r.locale): r for r in rows if r.org_id is None}
    click.echo(f"{'ID':>5}  {'ORIGIN':<8} {'KIND':<8} {'LOCALE':<6} {'PURPOSE':<21} META TEMPLATE")
    for row in rows:
        default = defaults.get((row.key, row.channel_kind, row.locale)) if row.org_id is not None else None
        mapping, inherited = meta_templates.effective(row, default)
        origin = "default" if row.org_id is None else "clinic"
        click.echo(f"{row.id:>5}  {origin:<8} {row.channel_kind:<8} {row.locale:<6} {row.key:<21} "
                   f"{_mapping_line(mapping, inherited) if row.channel_kind == 'whatsapp' else ''}")


@templates_group.command("show", help="Show a template: its texts, its Meta mapping and the JSON Meta receives "
                                      "(on sample data, never a patient's).")
@click.option("--org", "org_slug", required=True)
@click.argument("template_id", type=int)
def templates_show(org_slug: str, template_id: int) -> None:
    from engine.messaging import meta_templates, template_edits

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = org_of(conn, org_slug)
        try:
            row = template_edits.find_visible(conn, org.id, template_id)
        except template_edits.TemplateNotFound:
            fail(f"{org_slug} has no template {template_id}")
        mapping, inherited = template_edits.mapping_of(conn, row)
    click.echo(f"template {row.id} ({'default' if row.org_id is None else 'clinic'}): {row.key}, "
               f"{row.channel_kind}, {row.locale}")
    if row.subject:
        click.echo(f"subject: {row.subject}")
    click.echo("body:")
    click.echo(row.body)
    if row.channel_kind == "whatsapp":
        click.echo(f"meta: {_mapping_line(mapping, inherited)}")
        preview = meta_templates.preview(mapping)
        if preview is not None:
            click.echo("what Meta receives outside the 24-hour window (sample data):")
            click.echo(json.dumps(preview, ensure_ascii=False, indent=2))


def _save(org_slug: str, template_id: int, changes: Any) -> None:
    """Save `changes` to the org's template (a default's id customises it first), the WABA read
    before the saving transaction opens."""
    from engine.messaging import meta_templates, template_edits
    from engine.tenants.audit import audit

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = org_of(conn, org_slug)
        try:
            row = template_edits.find_visible(conn, org.id, template_id)
        except template_edits.TemplateNotFound:
            fail(f"{org_slug} has no template {template_id}")
        channel = template_edits.waba_for(conn, org.id, row.channel_kind)
    waba = meta_templates.read_waba(rt.providers, channel) if channel is not None else None
    try:
        with rt.db.begin() as conn:
            if row.org_id is None:
                saved = template_edits.customize(conn, org.id, key=row.key, kind=row.channel_kind, locale=row.locale,
                                                 changes=changes, waba=waba)
            else:
                saved = template_edits.change(conn, org.id, row.id, changes, waba=waba)
            audit(conn, org_id=org.id, action="create" if saved.created else "update", entity="templates",
                  entity_id=saved.id, changes=saved.changes)
    except template_edits.TemplateRefused as exc:
        click.echo(f"lembra: not saved:\n{_findings(exc.findings)}", err=True)
        sys.exit(1)
    for warning in saved.warnings:
        click.echo(f"warning: {warning.text}", err=True)
    if saved.created:
        click.echo(f"created {org_slug}'s own template {saved.id} from default {template_id}", err=True)
    click.echo(str(saved.id))


@templates_group.command("map", help="Set the approved Meta template a WhatsApp template sends outside the 24-hour "
                                     "window. TEMPLATE_ID may be a default's: the org's own copy of it is created. "
                                     "Checked against the clinic's WABA; prints the template id. Exit status: 0 "
                                     "saved (warnings on stderr), 1 refused (why on stderr), 2 bad arguments.")
@click.option("--org", "org_slug", required=True)
@click.argument("template_id", type=int)
@click.option("--name", default=None, help="The approved template's name at Meta, e.g. lembrete_sessao.")
@click.option("--language", default=None, help="Its language code at Meta, e.g. pt_BR.")
@click.option("--param", "params", multiple=True, metavar="VARIABLE",
              help="The Lembra variable of each {{1}}, {{2}}… in order; repeat it (--param nome --param data).")
@click.option("--button", "buttons", multiple=True, type=click.Choice(["confirm", "cancel"]),
              help="What each quick-reply button of the template does, in order; repeat it.")
@click.option("--default", "use_default", is_flag=True,
              help="Drop the template's own mapping: it sends its default's again.")
def templates_map(org_slug: str, template_id: int, name: str | None, language: str | None, params: tuple[str, ...],
                  buttons: tuple[str, ...], use_default: bool) -> None:
    from engine.messaging.meta_templates import MetaMapping
    from engine.messaging.template_edits import Changes

    if use_default:
        if name or language or params or buttons:
            fail("--default takes no --name, --language, --param or --button")
        _save(org_slug, template_id, Changes(meta=None))
        return
    if not name or not language:
        fail("give --name and --language (or --default)")
    _save(org_slug, template_id, Changes(meta=MetaMapping(name.strip(), language.strip(), params, buttons)))


def _read(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"{path} does not exist")
    except (OSError, UnicodeDecodeError):
        fail(f"cannot read {path} as UTF-8 text")
    return None


@templates_group.command("update", help="Change a template's texts (its Meta mapping stays). TEMPLATE_ID may be a "
                                        "default's: the org's own copy of it is created. Prints the template id; "
                                        "exit status as `map`.")
@click.option("--org", "org_slug", required=True)
@click.argument("template_id", type=int)
@click.option("--subject", default=None, help="E-mail subject.")
@click.option("--body-file", default=None, metavar="FILE", help="The text, from a UTF-8 file (- for stdin).")
@click.option("--html-file", default=None, metavar="FILE", help="The e-mail's HTML body, from a file.")
def templates_update(org_slug: str, template_id: int, subject: str | None, body_file: str | None,
                     html_file: str | None) -> None:
    from engine.messaging.template_edits import UNSET, Changes

    body, html = _read(body_file), _read(html_file)
    if subject is None and body is None and html is None:
        fail("give --subject, --body-file or --html-file")
    _save(org_slug, template_id, Changes(subject=subject if subject is not None else UNSET,
                                         body=body if body is not None else UNSET,
                                         body_html=html if html is not None else UNSET))


@templates_group.command("waba", help="List the templates of the clinic's WhatsApp Business Account (asked of Meta "
                                      "now), approved first: name, language, status, variables, buttons.")
@click.option("--org", "org_slug", required=True)
def templates_waba(org_slug: str) -> None:
    from engine.messaging import meta_templates
    from engine.words.catalogue import describe

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = org_of(conn, org_slug)
        channel = meta_templates.meta_channel(conn, org.id)
    if channel is None:
        fail(str(describe("waba_no_channel")))
    waba = meta_templates.read_waba(rt.providers, channel)
    if waba.problem is not None:
        fail(str(waba.problem.text))
    from engine.messaging.meta_categories import record_waba

    record_waba(rt.db, channel, waba)  # each template's category and status, as Meta lists them now
    click.echo(f"{'NAME':<32} {'LANGUAGE':<8} {'STATUS':<10} {'CATEGORY':<14} {'VARIABLES':>9}  BUTTONS")
    for template in meta_templates.offered(waba):
        kinds = ", ".join(b.type for b in template.buttons) or "-"
        variables = "named" if template.named else str(len(template.parameters))
        click.echo(f"{template.name:<32} {template.language:<8} {template.status:<10} {template.category or '-':<14} "
                   f"{variables:>9}  {kinds}")

