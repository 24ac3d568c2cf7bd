"""`lembra contacts …` and `lembra retention …`: erasure, consent evidence, contacts that share a
phone, and retention (engine/privacy).

What they print names contacts by id only (no names, phones or e-mails), but for the consent
evidence, which is the contact's own record and goes to stdout as JSON."""

from __future__ import annotations

import getpass
import json
import sys
from typing import Any

import click

from admin.cli.common import domain, fail, load_runtime, org_of


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no user name in a bare container
        return "cli"


@click.group("contacts", help="Contacts: erasure (LGPD), consent evidence, contacts that share a phone.")
def contacts_group() -> None:
    """Contact commands."""


@contacts_group.command("erase", help="Erase a contact (LGPD): anonymise it everywhere, cancel everything "
                                      "pending and every live follow-up, keep the counts and a tombstone. "
                                      "Asks first unless --yes.")
@click.option("--org", "org_slug", required=True)
@click.argument("contact_id", type=int)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def contacts_erase(org_slug: str, contact_id: int, yes: bool) -> None:
    from engine.tenants.audit import audit
    from engine.privacy import erasure

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = org_of(conn, org_slug)
        plan = domain(lambda: erasure.preview(conn, org.id, contact_id))
    if not yes:
        click.echo(f"contact {contact_id} of {org_slug}: {plan['messages']} messages, {plan['messages_to_cancel']} "
                   f"not sent yet, {plan['enrollments_to_end']} live follow-ups, {plan['replies']} replies", err=True)
        if not click.confirm("Erase it? This cannot be undone", err=True):
            fail("not erased")
    with rt.db.begin() as conn:
        done = domain(lambda: erasure.erase_contact(conn, org.id, contact_id, by=_who(), keyring=rt.keyring))
        audit(conn, org_id=org.id, action="erase", entity="contacts", entity_id=contact_id, changes=done.counts())
    click.echo(f"erased contact {contact_id} at {done.erased_at.isoformat()} by {done.erased_by}: "
               f"{done.messages_cancelled} messages cancelled, {done.enrollments_ended} follow-ups ended, "
               f"{done.messages_anonymised} messages and {done.replies_anonymised} replies anonymised, "
               f"{done.addresses_hashed} refused addresses kept hashed")


@contacts_group.command("consent", help="Print a contact's consent evidence as JSON: what they agreed to, when "
                                        "and how, and every opt-out (an erased contact's tombstone too).")
@click.option("--org", "org_slug", required=True)
@click.argument("contact_id", type=int)
def contacts_consent(org_slug: str, contact_id: int) -> None:
    from engine.privacy import consent

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = org_of(conn, org_slug)
        document = domain(lambda: consent.evidence(conn, org.id, contact_id))
    click.echo(json.dumps(document, ensure_ascii=False, indent=2))


@contacts_group.command("duplicates", help="List groups of contacts that share one phone (ids only): likely "
                                           "duplicates, or a family on one number.")
@click.option("--org", "org_slug", required=True)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1))
def contacts_duplicates(org_slug: str, limit: int) -> None:
    from engine.queue import address_optouts as addresses

    rt = load_runtime()
    with rt.db.connect() as conn:
        org = org_of(conn, org_slug)
        groups = addresses.shared_phones(conn, org.id, limit=limit)
    for ids in groups:
        click.echo(f"{len(ids)} contacts share a phone: {' '.join(str(i) for i in ids)}")
    if not groups:
        click.echo("no two contacts share a phone", err=True)


@click.group("retention", help="Retention of old data (SPEC §10): texts after the queue days, rows and events "
                               "after the events days. The scheduler runs it once a day.")
def retention_group() -> None:
    """Retention commands."""


def _org_ids(conn: Any, org_slug: str | None) -> list[tuple[int, str]]:
    from sqlalchemy import select

    from engine.store.models import orgs

    if org_slug:
        org = org_of(conn, org_slug)
        return [(org.id, org.slug)]
    return [(row.id, row.slug) for row in conn.execute(select(orgs.c.id, orgs.c.slug).order_by(orgs.c.id))]


@retention_group.command("run", help="Run retention now, to the end (every org, or one). With --dry-run, "
                                     "count what would go and change nothing.")
@click.option("--org", "org_slug", default=None)
@click.option("--dry-run", is_flag=True)
def retention_run(org_slug: str | None, dry_run: bool) -> None:
    from engine.privacy import retention

    rt = load_runtime()
    with rt.db.connect() as conn:
        targets = _org_ids(conn, org_slug)
    verb = "would change" if dry_run else "changed"
    for org_id, slug in targets:
        result = retention.run_org(rt.db, org_id, dry_run=dry_run)
        parts = ", ".join(f"{name} {rows}" for name, rows in result.counts.items() if rows) or "nothing"
        click.echo(f"{slug}: {verb} {parts}")


@retention_group.command("show", help="Show retention settings and the latest daily runs.")
@click.option("--org", "org_slug", default=None)
def retention_show(org_slug: str | None) -> None:
    from sqlalchemy import select

    from engine.store.models import orgs
    from engine.privacy import retention

    rt = load_runtime()
    with rt.db.connect() as conn:
        for org_id, slug in _org_ids(conn, org_slug):
            row = conn.execute(select(orgs.c.retention_queue_days, orgs.c.retention_events_days)
                               .where(orgs.c.id == org_id)).one()
            click.echo(f"{slug}: texts {row.retention_queue_days} days, rows and events {row.retention_events_days} days")
            for run in retention.last_runs(conn, org_id):
                state = "done" if run.finished_at is not None else "under way"
                total = sum(v for v in (run.counts or {}).values() if isinstance(v, int))
                click.echo(f"  {run.day} {state}: {total} rows")


@retention_group.command("set", help="Change an org's retention (days).")
@click.option("--org", "org_slug", required=True)
@click.option("--queue-days", type=int, default=None, help="Texts of finished messages, replies, sandbox copies "
                                                           "and webhook bodies (minimum 7).")
@click.option("--events-days", type=int, default=None, help="Finished messages, events, replies and webhook "
                                                            "deliveries (minimum 31: the dashboard counts 30).")
def retention_set(org_slug: str, queue_days: int | None, events_days: int | None) -> None:
    from engine.privacy import retention

    if queue_days is None and events_days is None:
        fail("give --queue-days, --events-days or both")
    rt = load_runtime()
    with rt.db.begin() as conn:
        org = org_of(conn, org_slug)
        queue, events = domain(lambda: retention.set_retention(conn, org.id, queue_days=queue_days,
                                                               events_days=events_days))
    click.echo(f"{org_slug}: texts {queue} days, rows and events {events} days")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as `lembra contacts …` / `lembra retention …`")
