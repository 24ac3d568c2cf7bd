"""Meta's categories and prices (issue 34): the template webhooks (category and status) for the
channel's own WABA only, the marketing flag in Modelos and on the Painel, Meta's 131050 as a
marketing-only opt-out, what each send records for its cost, the month's estimate, and the price
file (the repo's, an ops copy, a broken one).

Webhook bodies: tests/fixtures/providers/meta_whatsapp/webhook_template_category_update.json and
webhook_message_template_status_update.json (Meta's webhook reference shapes, our own values).
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from admin.app import create_app
from engine.flows.versions import create_flow
from engine.messaging import meta_categories, pricing
from engine.queue.outbox import enqueue
from engine.store.models import contacts, meta_template_states, messages
from engine.tenants.channels import create_channel
from engine.tenants.orgs import create_user
from tests.admin.conftest import login
from tests.fakes.meta import notes_error, sample_json
from tests.factories import World
from tests.test_meta_flow import APP_SECRET, PHONE, Graph, _send_due, meta_world, post, status_body, text_body

OTHER_WABA = "998877665544332"
REMINDER_FLOW = {
    "nodes": [{"id": "inicio", "type": "trigger", "config": {}},
              {"id": "lembra", "type": "action",
               "config": {"mode": "template", "template": "session_reminder", "channel_kinds": ["whatsapp"]}},
              {"id": "fim", "type": "end", "config": {"outcome": "converted"}}],
    "edges": [{"source": "inicio", "target": "lembra", "condition": {"type": "always"}},
              {"source": "lembra", "target": "fim", "condition": {"type": "always"}}],
}


def category_body(new: str = "MARKETING", previous: str = "UTILITY", name: str = "session_reminder_v1"):
    body = copy.deepcopy(sample_json("webhook_template_category_update.json"))
    value = body["entry"][0]["changes"][0]["value"]
    value.update(new_category=new, previous_category=previous, message_template_name=name)
    return body


def _states(rt, org_id: int):
    with rt.db.connect() as conn:
        return {(r.name, r.language): r for r in conn.execute(
            select(meta_template_states).where(meta_template_states.c.org_id == org_id))}


def _console(rt, world: World, email: str):
    app = create_app(rt)
    app.config["TESTING"] = True
    with rt.db.begin() as conn:
        create_user(conn, org_id=world.org_id, email=email, role="owner", password="senha-forte-a")
    return login(app.test_client(), email)


def test_template_webhooks_update_the_org_whose_waba_it_is_and_flag_marketing(rt, clock):
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph)
        other = World(rt, slug="outra")
        with rt.db.begin() as conn:
            other_channel = create_channel(conn, rt.keyring, org_id=other.org_id, kind="whatsapp", provider="meta",
                                           name="Meta da outra", credentials={
                                               "phone_number_id": "99", "access_token": "t", "app_secret": APP_SECRET,
                                               "verify_token": "v", "base_url": graph.url, "waba_id": OTHER_WABA})
        client = create_app(rt).test_client()

        # A bad signature is refused, and nothing is recorded.
        assert post(client, channel_id, category_body(), secret="not-the-secret").status_code == 401
        assert _states(rt, world.org_id) == {}

        # The category change, for this channel's WABA: recorded with what it was before; repeated, nothing moves.
        assert post(client, channel_id, category_body()).status_code == 200
        state = _states(rt, world.org_id)[("session_reminder_v1", "pt_BR")]
        assert (state.category, state.previous_category) == ("MARKETING", "UTILITY")
        first_change = state.changed_at
        assert post(client, channel_id, category_body()).status_code == 200
        assert _states(rt, world.org_id)[("session_reminder_v1", "pt_BR")].changed_at == first_change

        # The same change arriving on another clinic's channel names a WABA that is not theirs: untouched.
        assert post(client, other_channel, category_body()).status_code == 200
        assert _states(rt, other.org_id) == {}

        # The status update: PAUSED, with Meta's reason.
        status = sample_json("webhook_message_template_status_update.json")
        assert post(client, channel_id, status).status_code == 200
        state = _states(rt, world.org_id)[("session_reminder_v1", "pt_BR")]
        assert (state.status, state.reason, state.category) == ("PAUSED", status["entry"][0]["changes"][0]["value"]["reason"],
                                                                "MARKETING")

        with rt.db.connect() as conn:
            assert meta_categories.marketing_keys(conn, world.org_id) == {"session_reminder"}
            assert meta_categories.marketing_keys(conn, other.org_id) == set()
        console = _console(rt, world, "dona@sorriso.com.br")
        painel = console.get("/admin/").text
        assert "sai como marketing na Meta" in painel
        modelos = console.get("/admin/templates/").text
        assert "data-marketing" in modelos and "cerca de 9 vezes" in modelos
        assert 'data-category="MARKETING"' in modelos and 'data-status="PAUSED"' in modelos
        with rt.db.begin() as conn:  # a flow that sends the reminder's template is warned about it
            create_flow(conn, world.org_id, name="Lembrete extra", draft_graph=REMINDER_FLOW)
        fluxos = console.get("/admin/followup/flows/").text
        assert "Este fluxo envia o modelo “Lembrete de sessão”, que a Meta classificou como marketing" in fluxos


def test_131050_is_a_marketing_only_opt_out(rt, clock):
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph)
        contact = world.contact(phone=PHONE)
        twin = world.contact(name="Ana (outra ficha)", phone=PHONE, email=None)
        client = create_app(rt).test_client()
        assert post(client, channel_id, category_body(name="followup_rebook_v1")).status_code == 200

        def marketing(key: str) -> int:
            with rt.db.begin() as conn:
                return enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp",
                               purpose="followup", idempotency_key=key, template_key="followup_rebook",
                               respect_window=False)

        first = marketing("rebook:1")
        graph.script.append(notes_error(131050, "User has stopped marketing messages"))
        assert _send_due(rt) == ["failed"]
        assert world.message(first).error_code == "marketing_opted_out"
        with rt.db.connect() as conn:
            marked = dict(conn.execute(select(contacts.c.id, contacts.c.marketing_opted_out_at)
                                       .where(contacts.c.org_id == world.org_id)).all())
        assert marked[contact] is not None and marked[twin] is not None, "the person, whichever record"
        sends_before = len(graph.sends())

        second = marketing("rebook:2")
        assert _send_due(rt) == ["cancelled"]
        assert world.message(second).skip_reason == "marketing_opted_out"
        assert len(graph.sends()) == sends_before, "refused before it was sent"

        world.appointment(contact, clock.now() + timedelta(hours=30))
        clock.advance(timedelta(hours=6))
        assert _send_due(rt) == ["sent"], "the utility reminder still goes"
        assert graph.sends()[-1]["template"]["name"] == "session_reminder_v1"


def test_a_month_of_sends_costs_what_the_table_says_on_the_painel(rt, clock):
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph)
        contact = world.contact(phone=PHONE)
        client = create_app(rt).test_client()
        # Last month: not this month's cost.
        clock.advance(timedelta(days=-5))
        with rt.db.begin() as conn:
            enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp", purpose="followup",
                    idempotency_key="old", template_key="followup_checkin", respect_window=False)
        assert _send_due(rt) == ["sent"]
        clock.advance(timedelta(days=5))

        # Outside the window: the reminder as its (utility) template, billed.
        world.appointment(contact, clock.now() + timedelta(hours=30))
        clock.advance(timedelta(hours=6))
        assert _send_due(rt) == ["sent"]
        # The patient writes: inside the window a reply goes as free text, "service", free.
        now_ts = int(clock.now().timestamp())
        assert post(client, channel_id, text_body("wamid.IN9", "Obrigada!", now_ts)).status_code == 200
        clock.advance(timedelta(seconds=6))  # Meta's spacing between two messages to one person
        with rt.db.begin() as conn:
            enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp", purpose="followup",
                    idempotency_key="inside", template_key="followup_checkin", respect_window=False)
        assert _send_due(rt) == ["sent"]
        assert graph.sends()[-1]["type"] == "text"
        # A template Meta calls marketing, two days later (window closed): billed at the marketing rate.
        assert post(client, channel_id, category_body(name="followup_rebook_v1")).status_code == 200
        clock.advance(timedelta(days=2))
        with rt.db.begin() as conn:
            enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp", purpose="followup",
                    idempotency_key="promo", template_key="followup_rebook", respect_window=False)
        assert _send_due(rt) == ["sent"]

        with rt.db.connect() as conn:
            recorded = sorted((r.price_category, r.price_free, r.price_country) for r in conn.execute(
                select(messages).where(messages.c.org_id == world.org_id, messages.c.status == "sent")))
            assert recorded == [("marketing", False, "BR"), ("service", True, "BR"), ("utility", False, "BR"),
                                ("utility", False, "BR")]
            costs = pricing.month_costs(conn, world.org_id, pricing.load(), clock.now(), "America/Sao_Paulo")
        assert (costs.total.messages, costs.total.free) == (3, 1)
        assert costs.total.total == Decimal("0.0068") + Decimal("0.0625")
        assert costs.by_channel[channel_id].total == costs.total.total
        painel = _console(rt, world, "dona@sorriso.com.br").get("/admin/").text
        assert "Custo estimado do mês" in painel and "US$ 0,07" in painel


def test_the_price_file_loads_and_a_broken_ops_copy_says_where(rt, clock, tmp_path, monkeypatch):
    table = pricing.load()
    assert table.currency == "USD"
    assert table.price("BR", "marketing") == Decimal("0.0625") and table.price("BR", "utility") == Decimal("0.0068")
    assert table.price("AR", "marketing") is None, "a country the table does not price"

    ops = tmp_path / "precos.csv"
    ops.write_text("# ops copy\ncountry,currency,marketing,utility,authentication,service\n"
                   "BR,BRL,0.35,0.04,0.04,0\n*,BRL,0.50,0.10,0.10,0\n", encoding="utf-8")
    copy_table = pricing.load(ops)
    assert (copy_table.currency, copy_table.price("AR", "utility")) == ("BRL", Decimal("0.10"))

    ops.write_text("country,currency,marketing,utility,authentication,service\nBR,BRL,0.35,muito,0.04,0\n",
                   encoding="utf-8")
    with pytest.raises(pricing.PriceFileError, match=r"line 2: utility price 'muito' is not a number"):
        pricing.load(ops)
    with pytest.raises(pricing.PriceFileError, match="cannot be read"):
        pricing.load(tmp_path / "missing.csv")

    world = World(rt)
    monkeypatch.setattr(rt, "settings", dataclasses.replace(rt.settings, meta_prices=str(ops)))
    painel = _console(rt, world, "dona@sorriso.com.br").get("/admin/").text
    assert "A tabela de preços da Meta não pôde ser lida" in painel and "line 2" in painel


def test_131050_on_a_failed_status_is_the_same_marketing_only_opt_out(rt, clock):
    """Meta may accept the send and say 131050 later, on the message's `failed` status."""
    with Graph() as graph:
        world, channel_id = meta_world(rt, graph)
        contact = world.contact(phone=PHONE)
        with rt.db.begin() as conn:
            sent = enqueue(conn, org_id=world.org_id, contact_id=contact, channel_kind="whatsapp",
                           purpose="followup", idempotency_key="rebook:late", template_key="followup_rebook",
                           respect_window=False)
        assert _send_due(rt) == ["sent"]
        failed = status_body(world.message(sent).provider_message_id, "failed", int(clock.now().timestamp()))
        failed["entry"][0]["changes"][0]["value"]["statuses"][0]["errors"] = [
            {"code": 131050, "title": "Unable to deliver the message. This recipient has chosen to stop receiving "
                                      "marketing messages on WhatsApp from your business."}]
        assert post(create_app(rt).test_client(), channel_id, failed).status_code == 200
        with rt.db.connect() as conn:
            marked = conn.execute(select(contacts.c.marketing_opted_out_at).where(
                contacts.c.org_id == world.org_id, contacts.c.id == contact)).scalar_one()
        assert marked is not None
        assert world.message(sent).status == "failed"


@pytest.mark.parametrize("phone, country", [
    ("+5511987654321", "BR"),  # a calling code of one country: read from the prefix
    ("+352123456", "LU"),
    ("+14155550100", "US"),  # +1 is shared: the number says which country
    ("+14165550100", "CA"),
    ("+447700900123", None),  # +44 is shared and this range is no country's
    ("+80012345678", None),  # a non-geographic code
    ("+800 1234 5678", None),  # the same, written with spaces: parsed
    ("+999123456789", None),  # no such code
    ("5511987654321", None),  # not E.164
    (None, None),
])
def test_a_recipients_country_is_the_one_libphonenumber_gives(phone, country):
    assert pricing.country_of(phone) == country
