"""`lembra sandbox reply`: play the patient on the sandbox provider from a script or a doc. The reply
takes the console's Caixa do sandbox path (`admin.sandbox_chat`): the channel's signed webhook body
through `admin.webhooks.deliver`, then the inbound processing, done before the command exits; it
prints what the engine made of it. Neither the phone nor the text is logged or echoed."""

from __future__ import annotations

import json

import click

from admin.cli.common import fail, load_runtime

LANGS = ("pt_BR", "en")


@click.group("sandbox", help="The sandbox provider: answer as the patient.")
def sandbox() -> None:
    """The `lembra sandbox` group."""


@sandbox.command("reply", help="Deliver TEXT (or a tapped quick-reply button) as a patient's reply from PHONE to "
                               "the org's sandbox WhatsApp channel, act on it, and print what the engine made of it.")
@click.option("--org", "org_slug", required=True, help="The org's slug.")
@click.option("--phone", required=True, help="The patient's phone in E.164, e.g. +5516999887766.")
@click.option("--channel", "channel_id", type=int, default=None,
              help="A sandbox channel of the org (default: its sandbox WhatsApp channel).")
@click.option("--button", default=None,
              help="A quick-reply payload of the last message sent to PHONE, e.g. confirm:42.")
@click.option("--lang", type=click.Choice(LANGS), default="pt_BR", show_default=True,
              help="The language of the printed sentences.")
@click.option("--json", "as_json", is_flag=True, help="Print {inbound_id, outcome, contact_id, run_id} as JSON (run_id: the follow-up run that took the reply).")
@click.argument("text", required=False, default="")
def reply(org_slug: str, phone: str, channel_id: int | None, button: str | None, lang: str, as_json: bool,
          text: str) -> None:
    from admin.i18n import translate_to
    from admin.sandbox_chat import SandboxReplyError, reply_from_phone
    from engine.store.models import orgs
    from engine.words.catalogue import describe
    from engine.words.reasons import reply_outcome
    from sqlalchemy import select

    rt = load_runtime()
    try:
        with rt.db.connect() as conn:
            org_id = conn.execute(select(orgs.c.id).where(orgs.c.slug == org_slug)).scalar()
        if org_id is None:
            raise SandboxReplyError("sandbox_reply_org", slug=org_slug)
        made = reply_from_phone(rt, int(org_id), phone, text, channel_id=channel_id, button=button)
    except SandboxReplyError as exc:
        fail(translate_to(exc.text, lang))
    if as_json:
        click.echo(json.dumps(made.as_json(), ensure_ascii=False))
        return
    if made.run_id is not None:  # a flow took the reply: it answers, not a person
        click.echo(translate_to(describe("flow_reply_reading", flow=made.flow_name or f"#{made.run_id}"), lang))
        return
    click.echo(translate_to(reply_outcome(made.outcome), lang))
