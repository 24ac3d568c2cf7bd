"""Issue 9, point 11: an opt-out follows the person's address, not the contact row. A patient who
said SAIR (or unsubscribed, or asked the clinic) is not written to again when the same phone or
e-mail arrives as another contact: CSV import with another external id, the API, the console;
checked by populate, at send time and by the follow-up engine; the import says so. Contacts that
share a phone are findable. Nothing of org B is touched by org A's refusals."""

from __future__ import annotations

import itertools
from datetime import timedelta

from sqlalchemy import insert, select, update

from engine.core import clock as engine_clock
from engine.messaging import dispatch
from engine.people.contacts import create_contact, opt_out
from engine.people.imports import import_appointments
from engine.messaging.inbound import process_inbound
from engine.store.models import address_optouts, contacts, inbound_messages
from engine.queue.outbox import enqueue
from engine.queue import address_optouts as addresses
from tests.factories import World, local
from tests.flows.helpers import Flows, linear, node

PHONE = "+5516999887766"
HEADER = "external_id;contact_external_id;contact_name;phone;email;starts_at;professional;mode;location;status;consent"
APPOINTMENT = local(2026, 12, 3, 14, 0)
_ids = itertools.count(1)


def clinic(rt, slug: str = "clinica-a") -> World:
    world = World(rt, slug=slug)
    world.channel("whatsapp")
    world.channel("email")
    world.rule(1440, kinds=("whatsapp", "email"))
    return world


def write_in(rt, world: World, text: str = "SAIR", sender: str = "5516999887766@s.whatsapp.net") -> str | None:
    """The patient writes on the clinic's WhatsApp (as a webhook would store it), and it is processed."""
    with rt.db.begin() as conn:
        inbound_id = conn.execute(insert(inbound_messages).values(
            org_id=world.org_id, channel_id=world.channels["whatsapp"], provider_message_id=f"in-{next(_ids)}",
            from_address=sender, text=text, received_at=engine_clock.now(),
        ).returning(inbound_messages.c.id)).scalar_one()
    return process_inbound(rt, inbound_id)


def reminders(world: World, contact_id: int) -> list[tuple[str, str]]:
    return [(m.channel_kind, m.status) for m in world.messages(contact_id=contact_id, purpose="session_reminder")]


def contact_id(rt, world: World, external_id: str) -> int:
    with rt.db.connect() as conn:
        return conn.execute(select(contacts.c.id).where(contacts.c.org_id == world.org_id,
                                                        contacts.c.external_id == external_id)).scalar_one()


def send_due(rt) -> dict[int, str]:
    return {mid: dispatch.send_one(rt, mid) for mid in dispatch.claim_due(rt, limit=100)}


def test_sair_blocks_the_phone_for_a_new_contact_from_a_csv_with_another_external_id(rt, clock):
    a, b = clinic(rt, "clinica-a"), clinic(rt, "clinica-b")
    row = "AG-1;PAC-1;Ana Clara;(16) 99988-7766;ana@example.com;03/12/2026 14:00;;;;;whatsapp|email"
    for world in (a, b):
        import_appointments(rt.db, world.org_id, f"{HEADER}\n{row}")
    assert write_in(rt, a) == "opted_out"

    # The clinic's export brings the same patient back under another id, with another e-mail.
    again = "AG-2;PAC-9;Ana C. Souza;16 99988-7766;ana.souza@example.com;04/12/2026 10:00;;;;;whatsapp|email"
    report = import_appointments(rt.db, a.org_id, f"{HEADER}\n{again}")
    assert report.contacts_created == 1 and report.created == 1 and report.errors == []
    assert report.reminders_created == 0
    [(line, warning)] = report.warnings
    assert line == 2 and "email, sms, whatsapp" in str(warning)
    assert "99988" not in str(warning) and "Ana" not in str(warning)  # no values from the file
    assert report.counts()["warnings"] == 1
    assert reminders(a, contact_id(rt, a, "PAC-9")) == []

    # Org B's patient on the same number said nothing: B writes to both of its contacts.
    report_b = import_appointments(rt.db, b.org_id, f"{HEADER}\n{again}")
    assert report_b.warnings == [] and report_b.reminders_created == 1
    assert reminders(b, contact_id(rt, b, "PAC-1")) == [("whatsapp", "pending")]
    with rt.db.connect() as conn:
        assert conn.execute(select(address_optouts.c.org_id).distinct()).scalars().all() == [a.org_id]


def test_a_contact_created_on_a_refused_phone_gets_nothing_at_send_time_either(rt, clock):
    world = clinic(rt)
    first = world.contact(phone=PHONE, email="ana@example.com")
    assert write_in(rt, world) == "opted_out"
    # Another contact with that number (the API and the console go through create_contact).
    with rt.db.begin() as conn:
        second = create_contact(conn, org_id=world.org_id, name="Ana (novo cadastro)", phone="(16) 99988-7766",
                                email=None, external_id="ext-2", consent=("whatsapp", "email", "sms"))
    world.appointment(second, APPOINTMENT)
    assert reminders(world, second) == []
    # Something queued for it anyway (an ad-hoc message) is stopped when it is about to go out.
    with rt.db.begin() as conn:
        adhoc = enqueue(conn, org_id=world.org_id, contact_id=second, channel_kind="whatsapp", purpose="adhoc",
                        idempotency_key="api:k1", payload={"text": "oi"}, respect_window=False)
    assert send_due(rt)[adhoc] == "cancelled"
    row = world.message(adhoc)
    assert (row.status, row.skip_reason) == ("cancelled", "address_opted_out")
    assert [m.idempotency_key for m in world.sandbox()] == ["inbound:1:optout_confirmation"]  # the goodbye only
    assert first != second
    # A phone changed later on an existing contact (the API's and console's update) is caught too.
    third = world.contact(name="Outra pessoa", phone="+5516988887777", email=None)
    with rt.db.begin() as conn:
        conn.execute(update(contacts).where(contacts.c.id == third).values(phone=PHONE))
    world.appointment(third, APPOINTMENT + timedelta(hours=1))
    assert reminders(world, third) == []


def test_a_provider_unsubscribe_blocks_that_email_for_email_only(rt, clock):
    world = clinic(rt)
    first = world.contact(phone="+5516911112222", email="ana@example.com")
    with rt.db.begin() as conn:
        opt_out(conn, world.org_id, first, kinds=("email",), source="provider", evidence="provider status unsubscribed")
    # The same e-mail on a new contact with its own phone: WhatsApp still goes, e-mail never.
    second = world.contact(phone="+5516933334444", email="ANA@example.com")
    world.appointment(second, APPOINTMENT)
    assert reminders(world, second) == [("whatsapp", "pending")]
    with rt.db.begin() as conn:
        wanted = enqueue(conn, org_id=world.org_id, contact_id=second, channel_kind="email", purpose="adhoc",
                         idempotency_key="api:mail", payload={"text": "oi"}, respect_window=False)
    assert send_due(rt)[wanted] == "cancelled" and world.message(wanted).skip_reason == "address_opted_out"
    with rt.db.connect() as conn:
        assert addresses.contact_refused_kinds(conn, world.org_id, second) == {"email"}


def test_sair_from_a_number_no_contact_has_yet_still_holds_later(rt, clock):
    world = clinic(rt)
    assert write_in(rt, world, sender="+5516977776666") == "unknown_contact"
    newcomer = world.contact(phone="(16) 97777-6666", email=None)
    world.appointment(newcomer, APPOINTMENT)
    assert reminders(world, newcomer) == []
    # Anything else a patient writes from an unknown number blocks nothing.
    assert write_in(rt, world, text="bom dia", sender="+5516955554444") == "unknown_contact"
    other = world.contact(phone="+5516955554444", email=None)
    world.appointment(other, APPOINTMENT)
    assert reminders(world, other) == [("whatsapp", "pending")]


def test_the_follow_up_engine_honours_the_address_refusal(rt, clock):
    world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    for kind in ("whatsapp", "sms", "email"):
        world.channel(kind)
    flows = Flows(world)
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("msg", "action", mode="template", template="followup_checkin",
                                  channel_kinds=["email", "whatsapp"]),
                             node("fim", "end", outcome="converted")))
    refuser = world.contact(phone=PHONE, email="ana@example.com")
    assert write_in(rt, world) == "opted_out"
    # Same phone, another contact: every kind refused, the enrolment says why.
    twin = world.contact(name="Ana de novo", phone=PHONE, email="nova@example.com")
    with rt.db.begin() as conn:
        from engine.flows import triggers

        refused = triggers.enroll(conn, world.org_id, flow, twin, trigger_kind="manual", trigger_key="t",
                                  automatic=False)
    assert (refused.enrollment_id, refused.reason) == (None, "address_opted_out")
    # Only the e-mail refused (an unsubscribe): the node skips e-mail and writes on WhatsApp.
    mailer = world.contact(name="Bia", phone="+5516922223333", email="bia@example.com")
    with rt.db.begin() as conn:
        opt_out(conn, world.org_id, mailer, kinds=("email",), source="optout-page", evidence="signed link (POST)")
    colleague = world.contact(name="Bia (trabalho)", phone="+5516944445555", email="bia@example.com")
    enrollment_id = flows.enroll(flow, colleague)
    flows.run()
    [message] = flows.followups(enrollment_id)
    assert (message.channel_kind, message.status) == ("whatsapp", "sent")
    assert refuser not in {m.contact_id for m in world.messages(purpose="followup")}


def test_contacts_that_share_a_phone_are_findable_per_org(rt, clock):
    a, b = clinic(rt, "clinica-a"), clinic(rt, "clinica-b")
    parent = a.contact(name="Marta", phone=PHONE, email="marta@example.com")
    child = a.contact(name="Lucas", phone="(16) 99988-7766", email=None)
    alone = a.contact(name="Outra", phone="+5516900001111", email=None)
    b.contact(name="Marta na B", phone=PHONE, email=None)
    with rt.db.connect() as conn:
        assert addresses.sharing_phone(conn, a.org_id, parent) == [child]
        assert addresses.sharing_phone(conn, a.org_id, alone) == []
        assert addresses.shared_phones(conn, a.org_id) == [[parent, child]]
        assert addresses.shared_phones(conn, b.org_id) == []


def test_a_refusal_is_recorded_once_per_address_and_kind(rt, clock):
    world = clinic(rt)
    parent = world.contact(name="Marta", phone=PHONE, email="marta@example.com")
    world.contact(name="Lucas", phone=PHONE, email=None)
    assert write_in(rt, world) == "opted_out"
    assert write_in(rt, world) == "already_opted_out"
    with rt.db.connect() as conn:
        rows = conn.execute(select(address_optouts.c.address_kind, address_optouts.c.value,
                                   address_optouts.c.channel_kind, address_optouts.c.contact_id,
                                   address_optouts.c.source)
                            .order_by(address_optouts.c.address_kind, address_optouts.c.channel_kind)).all()
    assert [(r.address_kind, r.value, r.channel_kind) for r in rows] == [
        ("email", "marta@example.com", "email"), ("email", "marta@example.com", "sms"),
        ("email", "marta@example.com", "whatsapp"),
        ("phone", PHONE, "email"), ("phone", PHONE, "sms"), ("phone", PHONE, "whatsapp")]
    assert {r.source for r in rows} == {"reply:whatsapp"} and rows[3].contact_id == parent


def test_only_the_contact_that_refused_lifts_its_addresses_refusal_by_agreeing_again(rt, clock):
    from engine.people.contacts import set_consent

    world = clinic(rt)
    parent = world.contact(name="Marta", phone=PHONE, email="marta@example.com")
    child = world.contact(name="Lucas", phone=PHONE, email=None)
    assert write_in(rt, world) == "opted_out"  # both contacts on the number refuse; the parent's rows block it
    with rt.db.begin() as conn:
        set_consent(conn, world.org_id, child, "whatsapp", source="reply:whatsapp", evidence="inbound:9")
        assert dispatch.refusal(conn, world.org_id, child, "whatsapp") == "address_opted_out"
        set_consent(conn, world.org_id, parent, "whatsapp", source="reply:whatsapp", evidence="inbound:10")
        assert dispatch.refusal(conn, world.org_id, child, "whatsapp") is None
        assert dispatch.refusal(conn, world.org_id, parent, "whatsapp") is None
        assert dispatch.refusal(conn, world.org_id, parent, "sms") == "opted_out"
        assert addresses.contact_refused_kinds(conn, world.org_id, parent) == {"sms", "email"}


def test_the_public_opt_out_page_blocks_the_email_for_every_contact_on_it(rt, clock):
    from admin.app import create_app
    from engine.messaging.optout_links import OptOutTarget, make_token

    world = clinic(rt)
    first = world.contact(phone="+5516911112222", email="ana@example.com")
    token = make_token(rt.keyring, OptOutTarget(org_id=world.org_id, contact_id=first, kind="email"))
    response = create_app(rt).test_client().post(f"/optout/{token}", data={"List-Unsubscribe": "One-Click"})
    assert response.status_code == 200
    with rt.db.connect() as conn:
        [row] = conn.execute(select(address_optouts)).all()
    assert (row.address_kind, row.value, row.channel_kind, row.source) == (
        "email", "ana@example.com", "email", "list-unsubscribe")
    second = world.contact(phone="+5516933334444", email="ana@example.com")
    world.appointment(second, APPOINTMENT)
    assert reminders(world, second) == [("whatsapp", "pending")]
