"""`lembra understand`: how a patient's reply is understood (what a flow would see), for trying
phrasings, an org's keywords and an agent's LLM without sending anything. Without `--agent` the
built-in reader answers; with it, the agent's LLM (the built-in answer when the LLM's is unusable)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click

from admin.cli.common import domain, fail, load_runtime


def _when(value: str | None, zone: ZoneInfo, option: str) -> datetime | None:
    """An ISO date-time; a naive one is read in the org's timezone."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        fail(f"{option} must be an ISO date-time such as 2026-12-07T10:00:00-03:00, not {value!r}")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=zone)


def _org_context(slug: str, agent_ref: str | None) -> tuple[str, dict[str, Any], Any]:
    """The org's timezone and its own keywords (`reply_reading`) and, with `agent_ref`, the AI of
    that agent of the org (by id or name)."""
    from engine.tenants.orgs import org_by_slug, reply_reading

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = domain(lambda: org_by_slug(conn, slug))
        agent = _agent(conn, org.id, agent_ref) if agent_ref is not None else None
    ai = _agent_ai(agent, agent_ref, rt) if agent is not None else None
    return (*reply_reading(org), ai)


def _agent(conn: Any, org_id: int, ref: str) -> Any:
    """The org's agent whose id or name is `ref` (an id wins over a name that looks like one)."""
    from sqlalchemy import select

    from engine.store.models import agents

    query = select(agents).where(agents.c.org_id == org_id)
    row = None
    if ref.strip().isdigit():
        row = conn.execute(query.where(agents.c.id == int(ref))).first()
    if row is None:
        rows = conn.execute(query.where(agents.c.name == ref.strip()).order_by(agents.c.id)).all()
        if len(rows) > 1:
            fail(f"several agents are named {ref!r}: give the id")
        row = rows[0] if rows else None
    if row is None:
        fail(f"no agent {ref!r} in this org")
    return row


def _agent_ai(agent: Any, ref: str, rt: Any) -> Any:
    """The agent's LLM client; an agent without one, or one that cannot run, is said plainly."""
    from engine.flows.ai.factory import UnavailableAI, ai_for
    from engine.flows.ai.openai_compat import OpenAICompatAI

    ai = ai_for(agent, rt.keyring, egress=rt.settings.egress)
    if isinstance(ai, UnavailableAI):
        fail(f"agent {ref!r}: {ai.message} ({ai.code})")
    if not isinstance(ai, OpenAICompatAI):
        fail(f"agent {ref!r} has no LLM configured (base URL and model): leave out --agent for the built-in reader")
    return ai


@click.command("understand", help="Show how a patient's reply is understood: intent, date, time, period.")
@click.option("--org", "org_slug", default=None, help="Use this org's timezone and keywords.")
@click.option("--agent", "agent_ref", default=None,
              help="Understand with this agent's LLM (its id or name; needs --org).")
@click.option("--now", "now_iso", default=None, help="The current time (ISO; default: now).")
@click.option("--appointment-at", "appointment_iso", default=None, help="The appointment discussed (ISO).")
@click.option("--pending", multiple=True, help="A field the conversation awaits (e.g. choice); repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.argument("text")
def understand(org_slug: str | None, agent_ref: str | None, now_iso: str | None, appointment_iso: str | None,
               pending: tuple[str, ...], as_json: bool, text: str) -> None:
    from engine.words.understanding import Context
    from engine.words.understanding import understand as read

    if agent_ref is not None and not org_slug:
        fail("--agent needs --org: an agent belongs to an org")
    timezone, keywords, ai = _org_context(org_slug, agent_ref) if org_slug else (Context.timezone, {}, None)
    zone = ZoneInfo(timezone)
    now = _when(now_iso, zone, "--now") or datetime.now(zone)
    context = Context(now=now, timezone=timezone, appointment_at=_when(appointment_iso, zone, "--appointment-at"),
                      pending=pending, keywords=keywords or None)
    result = (ai.understand(text, context) if ai is not None else read(text, context)).as_json()
    if as_json:
        click.echo(json.dumps(result, ensure_ascii=False))
        return
    click.echo(f"intent: {result['intent']} (confidence {result['confidence']})")
    if ai is not None:
        click.echo(f"engine: {result['engine']} ({result['llm_calls']} LLM call{'s' * (result['llm_calls'] != 1)})")
    for name, value in result["fields"].items():
        click.echo(f"{name}: {'-' if value is None else value}")
