"""The demo clinic `lembra up` seeds: what a newcomer's first conversation needs is there, once."""

from __future__ import annotations

from datetime import datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

from sqlalchemy import select

from engine.fleet.demo import seed
from engine.flows.conversation.fields import list_fields
from engine.people.appointments import set_status
from engine.store.models import appointments, channels, contacts, messages
from tests.flows.helpers import Flows


def test_the_demo_declares_the_fields_its_conversations_ask_for_and_seeds_once(rt):
    with rt.db.begin() as conn:
        first = seed(conn, rt.keyring)
    with rt.db.begin() as conn:
        again = seed(conn, rt.keyring)
    assert first.created and not again.created and again.org_id == first.org_id
    with rt.db.connect() as conn:
        found = {f.slug: (f.type, f.harvest) for f in list_fields(conn, first.org_id)}
    assert found == {"data": ("date", "any_reply"), "periodo": ("period", "any_reply"),
                     "horario": ("time", "any_reply")}


# --- the demo's rebooking conversations, played from the sandbox chat ----------------------------

SP = ZoneInfo("America/Sao_Paulo")


def _demo(rt):
    with rt.db.begin() as conn:
        org_id = seed(conn, rt.keyring).org_id
    with rt.db.connect() as conn:
        kinds = {row.kind: row.id for row in conn.execute(select(channels.c.kind, channels.c.id).where(
            channels.c.org_id == org_id))}
    return Flows(SimpleNamespace(rt=rt, org_id=org_id, channels=kinds))


def _patient(rt, org_id: int, name: str):
    with rt.db.connect() as conn:
        contact = conn.execute(select(contacts).where(contacts.c.org_id == org_id, contacts.c.name == name)).one()
        appointment = conn.execute(select(appointments).where(appointments.c.org_id == org_id,
                                                              appointments.c.contact_id == contact.id)).one()
    return contact, appointment


def _texts_to(rt, org_id: int, contact_id: int, since: int = 0) -> list[str]:
    with rt.db.connect() as conn:
        rows = conn.execute(select(messages.c.template_key, messages.c.payload).where(
            messages.c.org_id == org_id, messages.c.contact_id == contact_id, messages.c.id > since,
            messages.c.status.in_(("sent", "delivered", "read"))).order_by(messages.c.id)).all()
    return [(row.payload or {}).get("text") or row.template_key for row in rows]


def _last_id(rt) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(messages.c.id).order_by(messages.c.id.desc()).limit(1)).scalar() or 0


def _say(flows: Flows, clock, phone: str, text: str) -> None:
    flows.reply(text, sender=phone)
    clock.advance(timedelta(seconds=9))  # the org's debounce
    flows.run()


def test_a_patient_who_writes_that_they_want_another_time_is_rebooked_by_the_demo(rt, clock):
    flows = _demo(rt)
    flows.run()
    bruno, appointment = _patient(rt, flows.org_id, "Bruno Lima")
    before = _last_id(rt)
    _say(flows, clock, bruno.phone, "posso remarcar para sexta de manhã?")
    [offer] = _texts_to(rt, flows.org_id, bruno.id, before)
    assert offer.startswith("Tenho estes horários livres:\n1. sexta-feira, 04/12 às 08:00 (Dra. Beatriz Costa)")
    _say(flows, clock, bruno.phone, "1")
    _, moved = _patient(rt, flows.org_id, "Bruno Lima")
    assert moved.starts_at.astimezone(SP) == datetime(2026, 12, 4, 8, 0, tzinfo=SP)
    after = _texts_to(rt, flows.org_id, bruno.id, before)[1:]
    assert after == ["session_confirmation"], "one confirmation of the new time, nothing else"


def test_a_no_show_is_rebooked_from_the_sandbox_chat_with_no_staff_action(rt, clock):
    flows = _demo(rt)
    flows.run()
    ana, missed = _patient(rt, flows.org_id, "Ana Clara Souza")
    before = _last_id(rt)
    with rt.db.begin() as conn:  # the receptionist marks "não compareceu"
        set_status(conn, flows.org_id, missed.id, missed.status, "no_show")
    flows.run()
    assert _texts_to(rt, flows.org_id, ana.id, before) == ["followup_rebook"]
    _say(flows, clock, ana.phone, "pode ser segunda de tarde")
    offer = _texts_to(rt, flows.org_id, ana.id, before)[-1]
    assert offer.splitlines()[1] == "1. segunda-feira, 07/12 às 13:00 (Dra. Beatriz Costa)"
    _say(flows, clock, ana.phone, "1")
    with rt.db.connect() as conn:
        rows = conn.execute(select(appointments.c.starts_at, appointments.c.status).where(
            appointments.c.org_id == flows.org_id, appointments.c.contact_id == ana.id)
            .order_by(appointments.c.id)).all()
    assert [(r.starts_at.astimezone(SP), r.status) for r in rows] == [
        (missed.starts_at.astimezone(SP), "no_show"), (datetime(2026, 12, 7, 13, 0, tzinfo=SP), "scheduled")]
    assert _texts_to(rt, flows.org_id, ana.id, before)[-1] == "session_confirmation"


# --- the demo shows the whole funnel and who published its flows (issue 33) ---------------------------

def test_the_demos_messages_are_delivered_then_read_a_few_seconds_after_the_send(rt, clock):
    from engine.fleet.demo import DEMO_RECEIPTS_SECONDS
    from engine.fleet.scheduler import Scheduler

    flows = _demo(rt)
    flows.run()
    sent = _last_id(rt)
    assert sent, "the demo sends at once"
    tick = lambda: Scheduler(rt, enqueue=lambda batch: None).tick()  # noqa: E731
    with rt.db.connect() as conn:
        status = lambda: conn.execute(select(messages.c.status).where(messages.c.id == sent)).scalar_one()  # noqa: E731
        assert status() == "sent"
        clock.advance(timedelta(seconds=DEMO_RECEIPTS_SECONDS))
        tick()
        conn.rollback()
        assert status() == "delivered"
        clock.advance(timedelta(seconds=DEMO_RECEIPTS_SECONDS))
        tick()
        conn.rollback()
        assert status() == "read"


def test_the_demos_flows_say_lembra_published_them(rt, clock):
    import re

    from admin.app import create_app
    from engine.fleet.demo import DEMO_EMAIL, DEMO_PASSWORD

    _demo(rt)
    client = create_app(rt).test_client()
    login = client.get("/login").text
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', login).group(1)
    assert client.post("/login", data={"email": DEMO_EMAIL, "password": DEMO_PASSWORD,
                                       "csrf_token": token}).status_code == 302
    page = client.get("/admin/followup/flows/").text
    assert page.count("por Lembra (demonstração)") == 3
    assert "usuário removido ou pela API" not in page
    # The version says who published it; the audit log keeps what people did, not the seed's work.
    from engine.store.models import audit_log, flow_versions

    with rt.db.connect() as conn:
        assert set(conn.execute(select(flow_versions.c.published_by)).scalars()) == {"demo"}
        assert conn.execute(select(audit_log.c.id).where(audit_log.c.entity == "flow_versions")).first() is None
