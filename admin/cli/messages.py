"""`lembra messages`: the queue, in words (or codes, for scripts)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click
from sqlalchemy import func, select

from admin.cli.common import fail, load_runtime, org_of


@click.command(help="Show the queue (no message bodies, no phone numbers). STATUS and REASON are in words; "
                    "--codes prints the raw codes instead, for scripts.")
@click.option("--status", default=None, help="Only this status (one of the codes --codes prints).")
@click.option("--org", "org_slug", default=None)
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--codes", is_flag=True, help="Print status and reason as codes, not sentences.")
def messages(status: str | None, org_slug: str | None, limit: int, codes: bool) -> None:
    from engine.store.models import MESSAGE_STATUSES
    from engine.store.models import messages as messages_table
    from engine.store.models import orgs as orgs_table

    if status is not None and status not in MESSAGE_STATUSES:
        fail(f"status must be one of {', '.join(MESSAGE_STATUSES)}")
    rt = load_runtime()
    m = messages_table
    with rt.db.connect() as conn:
        query = select(m.c.id, orgs_table.c.slug, m.c.purpose, m.c.channel_kind, m.c.status, m.c.due_at,
                       m.c.attempts, m.c.error_code, m.c.skip_reason).join(orgs_table, orgs_table.c.id == m.c.org_id)
        counts = select(m.c.status, func.count()).group_by(m.c.status)
        if org_slug:
            org = org_of(conn, org_slug)
            query = query.where(m.c.org_id == org.id)
            counts = counts.where(m.c.org_id == org.id)
        if status:
            query = query.where(m.c.status == status)
        rows = conn.execute(query.order_by(m.c.id.desc()).limit(limit)).all()
        totals = conn.execute(counts).all()
    width = 10 if codes else 34  # the longest status label
    header = (f"{'ID':>7}  {'ORG':<12} {'PURPOSE':<22} {'KIND':<8} {'STATUS':<{width}} {'DUE (UTC)':<17} "
              f"{'TRY':>3}  REASON")
    click.echo(header)
    for r in rows:
        due = r.due_at.strftime("%Y-%m-%d %H:%M") if isinstance(r.due_at, datetime) else "-"
        shown_status, reason = _message_words(r, codes)
        click.echo(f"{r.id:>7}  {r.slug[:12]:<12} {r.purpose[:22]:<22} {r.channel_kind:<8} {shown_status:<{width}} "
                   f"{due:<17} {r.attempts:>3}  {reason}")
    click.echo("totals: " + (", ".join(f"{s}={n}" for s, n in sorted(totals)) or "empty"))


def _message_words(row: Any, codes: bool) -> tuple[str, str]:
    """A queue row's status and reason: the catalogue's pt-BR words, or the raw codes."""
    from engine.words.reasons import row_reason, status_label

    if codes:
        return row.status, row.error_code or row.skip_reason or ""
    reason = row_reason(row.error_code, row.skip_reason, kind=row.channel_kind)
    return str(status_label(row.status)), str(reason) if reason is not None else ""
