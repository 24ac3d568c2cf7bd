"""`lembra flows …` and `lembra enrollments`: follow-up flows and their runs."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import click

from admin.cli.common import domain, fail, load_runtime


@click.group(help="Follow-up flows (build them in the console or through the API).")
def flows() -> None:
    """Flow commands."""


def _flow_document(document: Any) -> tuple[Any, Any, Any]:
    """(graph, trigger_config, max_steps) of a flow file: a bare graph `{nodes, edges}`, or an
    object holding it as `graph` (or `draft_graph`, as `GET /flows/{id}` exports it) with the
    flow's `trigger_config` and `max_steps`. A bare graph is checked as a manual flow."""
    if isinstance(document, dict):
        for key in ("graph", "draft_graph"):
            if key in document:
                return document[key], document.get("trigger_config", {"kind": "manual"}), document.get("max_steps", 30)
    return document, {"kind": "manual"}, 30


@flows.command("validate", help="Check a flow file (JSON) against every publish rule, without a database. "
                                "Prints one line per issue (node: code — sentence). Exit status: 0 no issues, "
                                "1 issues, 2 a missing or unreadable file.")
@click.argument("file")
def flows_validate(file: str) -> None:
    import json
    from pathlib import Path

    from engine.flows.queries import sentence
    from engine.flows.validate import validate_for_publish

    try:
        document = json.loads(Path(file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        fail(f"{file} does not exist")
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(f"{file} is not UTF-8 text")
    except json.JSONDecodeError as exc:
        fail(f"{file} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})")
    except (ValueError, RecursionError):
        fail(f"{file} is not valid JSON")
    graph, trigger_config, max_steps = _flow_document(document)
    issues = validate_for_publish(graph, trigger_config=trigger_config, max_steps=max_steps, template_exists=None)
    if not issues:
        click.echo("ok")
        return
    for issue in issues:
        text = sentence(issue.code, issue.params)
        click.echo(f"{issue.node_id or '-'}: {issue.code} — {text if text is not None else issue.code}")
    sys.exit(1)


@flows.command("list", help="List an org's flows: status, active version and live enrollments.")
@click.option("--org", "org_slug", required=True)
def flows_list(org_slug: str) -> None:
    from engine.flows import queries
    from engine.store.models import flow_pointers
    from engine.tenants.orgs import org_by_slug

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = domain(lambda: org_by_slug(conn, org_slug))
        rows = conn.execute(queries.flows_query(org.id).order_by(flow_pointers.c.id)).all()
        live = queries.live_counts(conn, org.id)
    click.echo(f"{'ID':>5}  {'STATUS':<9} {'VERSION':>7} {'LIVE':>6}  NAME")
    for row in rows:
        version = str(row.active_version) if row.active_version is not None else "-"
        click.echo(f"{row.id:>5}  {row.status:<9} {version:>7} {live.get(row.id, 0):>6}  {row.name}")


@flows.command("enroll", help="Start a flow for a contact by hand (its trigger and repeat policy do not apply). "
                              "Prints the enrollment id; exit status 1 with the reason when the engine refuses. "
                              "With --key, running it again answers the same enrollment.")
@click.argument("flow_id", type=int)
@click.option("--org", "org_slug", required=True)
@click.option("--contact", "contact_id", required=True, type=int, help="The contact's id.")
@click.option("--key", default=None, help="Your idempotency key for this enrollment.")
def flows_enroll(flow_id: int, org_slug: str, contact_id: int, key: str | None) -> None:
    from engine.flows import queries, triggers
    from engine.tenants.orgs import org_by_slug

    if key is not None and not key.strip():
        fail("--key must not be blank")
    rt = load_runtime()
    with rt.db.begin() as conn:
        org = domain(lambda: org_by_slug(conn, org_slug))
        result = triggers.enroll(conn, org.id, flow_id, contact_id, trigger_kind="manual",
                                 trigger_key=f"cli:{key}" if key else "cli", caller_key=f"cli:{key}" if key else None,
                                 automatic=False)
    if result.enrollment_id is None:
        text = queries.sentence(result.reason)
        click.echo(f"lembra: not enrolled: {text if text is not None else result.reason} ({result.reason})", err=True)
        sys.exit(1)
    if not result.created:
        click.echo(f"already enrolled with key {key}", err=True)
    click.echo(str(result.enrollment_id))


@click.command(help="Show an org's follow-up runs, newest first (codes and node ids only: no patient data).")
@click.option("--org", "org_slug", required=True)
@click.option("--status", default=None)
@click.option("--flow", "flow_id", default=None, type=int, help="Only this flow's runs.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
def enrollments(org_slug: str, status: str | None, flow_id: int | None, limit: int) -> None:
    from engine.flows import queries
    from engine.store.models import enrollments as enrollments_table
    from engine.tenants.orgs import org_by_slug

    if status is not None and status not in queries.ENROLLMENT_STATUSES:
        fail(f"status must be one of {', '.join(queries.ENROLLMENT_STATUSES)}")
    rt = load_runtime()
    with rt.db.connect() as conn:
        org = domain(lambda: org_by_slug(conn, org_slug))
        query = queries.enrollments_query(org.id, flow_id=flow_id, status=status)
        rows = conn.execute(query.order_by(enrollments_table.c.id.desc()).limit(limit)).all()
    click.echo(f"{'ID':>7}  {'FLOW':>5}  {'NODE':<20} {'STATUS':<14} {'NEXT (UTC)':<17} REASON")
    for r in rows:
        due = r.next_eval_at.strftime("%Y-%m-%d %H:%M") if isinstance(r.next_eval_at, datetime) else "-"
        click.echo(f"{r.id:>7}  {r.pointer_id:>5}  {r.current_node_id[:20]:<20} {r.status:<14} {due:<17} "
                   f"{queries.reason_code(r) or ''}")
