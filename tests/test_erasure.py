"""Issue 9, point 13: erasure of a contact (`lembra contacts erase`, the engine underneath the
console and `DELETE /api/v1/contacts/<id>`) and the consent-evidence export. The person is
anonymised everywhere, nothing more is sent to them, the counts and a tombstone stay, their
refusals keep blocking their address without keeping it in plain, and org B is never touched."""

from __future__ import annotations

import base64
import itertools
import json
from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import func, insert, select

from admin.cli import main
from engine.core import clock as engine_clock
from engine.messaging import dispatch
from engine.tenants.audit import audit
from engine.people.contacts import create_contact
from engine.messaging.inbound import process_inbound
from engine.store.models import (
    address_optouts,
    audit_log,
    contacts,
    enrollments,
    inbound_messages,
    preferences,
    sandbox_messages,
)
from engine.privacy import consent, erasure
from engine.queue import address_optouts as addresses
from gateway.crypto import Keyring
from tests.conftest import TEST_KEY
from tests.factories import World, local
from tests.flows.helpers import Flows, linear, node
from tests.processes import lembra_env

PHONE = "+5516999887766"
APPOINTMENT = local(2026, 12, 3, 14, 0)
_ids = itertools.count(1)


def clinic(rt, slug: str) -> tuple[World, Flows]:
    world = World(rt, slug=slug, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
    world.channel("whatsapp")
    world.channel("email")
    world.rule(1440, kinds=("whatsapp", "email"))
    return world, Flows(world)


def write_in(rt, world: World, text: str, sender: str = PHONE) -> str | None:
    with rt.db.begin() as conn:
        inbound_id = conn.execute(insert(inbound_messages).values(
            org_id=world.org_id, channel_id=world.channels["whatsapp"], provider_message_id=f"in-{next(_ids)}",
            from_address=sender, text=text, received_at=engine_clock.now()).returning(inbound_messages.c.id)).scalar_one()
    return process_inbound(rt, inbound_id)


def patient(rt, world: World, flows: Flows, *, name: str = "Ana Clara Souza", phone: str = PHONE,
            email: str = "ana@example.com") -> tuple[int, int]:
    """A contact created by the API (with its audit row) with a sent message, a reply, a reminder
    due later and a follow-up run waiting. Returns (contact id, enrollment id)."""
    with rt.db.begin() as conn:
        contact = create_contact(conn, org_id=world.org_id, name=name, phone=phone, email=email,
                                 external_id=f"PAC-{next(_ids)}", consent=("whatsapp", "email"), consent_source="api")
        audit(conn, org_id=world.org_id, action="create", entity="contact", entity_id=contact,
              changes={"external_id": "PAC", "name": name, "locale": "pt_BR", "consent": ["whatsapp", "email"]})
    world.appointment(contact, APPOINTMENT)
    flow = flows.flow(linear(node("inicio", "trigger"),
                             node("msg", "action", mode="template", template="followup_checkin"),
                             node("espera", "wait", mode="fixed", minutes=600), node("fim", "end", outcome="exhausted")))
    run = flows.enroll(flow, contact)
    flows.run()
    assert write_in(rt, world, "Obrigada, até quinta!", sender=phone) == "free_text"
    return contact, run


def rows(rt, table, *where):
    with rt.db.connect() as conn:
        return conn.execute(select(table).where(*where).order_by(table.c.id)).all()


def test_erasure_anonymises_everywhere_cancels_everything_and_keeps_counts_and_a_tombstone(rt, clock):
    a, a_flows = clinic(rt, "clinica-a")
    b, b_flows = clinic(rt, "clinica-b")
    contact, run = patient(rt, a, a_flows)
    b_contact, _ = patient(rt, b, b_flows)  # the same person, another clinic
    before = {m.id: m.status for m in a.messages(contact_id=contact)}
    assert "pending" in before.values() and "sent" in before.values()
    b_before = [(m.id, m.status, m.body) for m in b.messages()]

    with rt.db.begin() as conn:
        plan = erasure.preview(conn, a.org_id, contact)
        done = erasure.erase_contact(conn, a.org_id, contact, by="user:7", keyring=rt.keyring)
    assert plan["messages"] == len(before) and plan["enrollments_to_end"] == 1 and plan["replies"] == 1
    assert done.messages_cancelled == list(before.values()).count("pending") and done.enrollments_ended == 1

    [tomb] = rows(rt, contacts, contacts.c.id == contact)
    assert (tomb.name, tomb.phone, tomb.email, tomb.locale) == (None, None, None, None)
    assert tomb.erased_at == clock.now() and tomb.erased_by == "user:7" and tomb.external_id.startswith("PAC-")
    after = {m.id: m for m in a.messages(contact_id=contact)}
    assert set(after) == set(before)  # every row (and so every count) stays
    assert all(m.body is None and m.subject is None and m.anonymised_at is not None for m in after.values())
    assert {m.id: m.status for m in after.values()} == {
        mid: ("cancelled" if status == "pending" else status) for mid, status in before.items()}
    assert {m.skip_reason for m in after.values() if before[m.id] == "pending"} == {"contact_erased"}
    [enrollment] = rows(rt, enrollments, enrollments.c.id == run)
    assert (enrollment.status, enrollment.outcome, enrollment.cancel_reason) == ("cancelled", "opted_out",
                                                                                 "contact_erased")
    [reply] = rows(rt, inbound_messages, inbound_messages.c.org_id == a.org_id)
    assert (reply.text, reply.from_address) == (None, None)
    sandbox = rows(rt, sandbox_messages, sandbox_messages.c.org_id == a.org_id)
    assert sandbox and all((s.to_address, s.body) == ("", None) for s in sandbox)
    [entry] = rows(rt, audit_log, audit_log.c.org_id == a.org_id, audit_log.c.entity == "contact")
    assert entry.changes == {"external_id": "[erased]", "name": "[erased]", "locale": "[erased]",
                             "consent": "[erased]"}
    # Org B: the same person there is untouched.
    assert [(m.id, m.status, m.body) for m in b.messages()] == b_before
    # Nothing is sent to them any more (B's reminder to the same person still is).
    clock.set(local(2026, 12, 2, 14, 0))
    claimed = dispatch.claim_due(rt, limit=100)
    assert claimed and not set(claimed) & set(after)
    # The tombstone keeps its consent record as evidence; the API and the console no longer find it.
    assert {p.kind for p in rows(rt, preferences, preferences.c.contact_id == contact)} == {"whatsapp", "email"}
    with rt.db.connect() as conn:
        assert addresses.sharing_phone(conn, a.org_id, contact) == []
        with pytest.raises(erasure.ContactNotFound):
            erasure.erase_contact(conn, a.org_id, contact, by="user:7", keyring=rt.keyring)
    assert rows(rt, contacts, contacts.c.id == b_contact)[0].phone == PHONE
    assert all(r.text for r in rows(rt, inbound_messages, inbound_messages.c.org_id == b.org_id))


def test_an_erased_persons_refusal_stays_without_their_plain_address(rt, clock):
    a, _ = clinic(rt, "clinica-a")
    b, _ = clinic(rt, "clinica-b")
    contact = a.contact(phone=PHONE, email="ana@example.com")
    b.contact(phone=PHONE, email="ana@example.com")
    assert write_in(rt, a, "SAIR") == "opted_out"
    with rt.db.begin() as conn:
        done = erasure.erase_contact(conn, a.org_id, contact, by="cli:ops", keyring=rt.keyring)
    assert done.addresses_hashed == 6  # phone and e-mail × three kinds
    stored = rows(rt, address_optouts)
    assert all(r.value is None and len(r.value_hash) == 64 and r.hash_version == 1 for r in stored)
    assert PHONE not in json.dumps([tuple(map(str, r)) for r in stored])
    with rt.db.connect() as conn:
        assert addresses.has_hashed(conn, a.org_id) and not addresses.has_hashed(conn, b.org_id)

    # The person comes back as a new patient (an import, the API, the console): still refused.
    with rt.db.begin() as conn:
        again = create_contact(conn, org_id=a.org_id, name="Ana", phone="(16) 99988-7766", email=None,
                               consent=("whatsapp", "email", "sms"))
    a.appointment(again, APPOINTMENT)
    assert a.messages(contact_id=again, purpose="session_reminder") == []
    with rt.db.connect() as conn:
        assert addresses.contact_refused_kinds(conn, a.org_id, again) == {"whatsapp", "sms", "email"}
        plain = conn.execute(select(address_optouts.c.value).where(address_optouts.c.address_kind == "phone")
                             .distinct()).scalars().all()
    assert plain == [PHONE]  # a live contact carries it again; the e-mail stays hashed
    # Org B never refused: its contact gets its reminder.
    b_contact = rows(rt, contacts, contacts.c.org_id == b.org_id)[0].id
    b.appointment(b_contact, APPOINTMENT)
    assert [m.status for m in b.messages(contact_id=b_contact, purpose="session_reminder")] == ["pending"]


def test_a_hash_made_before_a_key_rotation_is_still_recognised(rt, clock):
    world, _ = clinic(rt, "clinica-a")
    contact = world.contact(phone=PHONE, email=None)
    assert write_in(rt, world, "SAIR") == "opted_out"
    with rt.db.begin() as conn:
        erasure.erase_contact(conn, world.org_id, contact, by="cli:ops", keyring=rt.keyring)
    rotated = Keyring.parse("2:" + base64.b64encode(b"another-key-0123456789abcdefghij").decode() + "," + TEST_KEY)
    assert rotated.current_version == 2
    with rt.db.begin() as conn:
        assert addresses.recognise(conn, world.org_id, [("phone", PHONE)], keyring=rotated) == 3
    with rt.db.connect() as conn:
        assert addresses.refused_kinds_for(conn, world.org_id, [("phone", PHONE)]) == {"whatsapp", "sms", "email"}


def test_erasing_one_of_a_family_keeps_the_others_data_and_refusal(rt, clock):
    world, _ = clinic(rt, "clinica-a")
    parent = world.contact(name="Marta", phone=PHONE, email="marta@example.com")
    child = world.contact(name="Lucas", phone=PHONE, email=None)
    assert write_in(rt, world, "SAIR") == "opted_out"
    assert write_in(rt, world, "obrigada") == "free_text"  # linked to the parent (the oldest)
    with rt.db.begin() as conn:
        done = erasure.erase_contact(conn, world.org_id, child, by="user:1", keyring=rt.keyring)
    assert done.addresses_hashed == 0  # the parent still carries the phone
    assert rows(rt, contacts, contacts.c.id == parent)[0].phone == PHONE
    assert {r.value for r in rows(rt, address_optouts)} == {PHONE, "marta@example.com"}
    assert all(r.text for r in rows(rt, inbound_messages))  # the parent's replies


def test_the_consent_evidence_says_what_was_agreed_when_how_and_every_opt_out(rt, clock):
    world, _ = clinic(rt, "clinica-a")
    other, _ = clinic(rt, "clinica-b")
    with rt.db.begin() as conn:
        contact = create_contact(conn, org_id=world.org_id, name="Ana", phone=PHONE, email="ana@example.com",
                                 external_id="PAC-1", consent=("whatsapp", "email"), consent_source="api",
                                 consent_evidence="formulário de cadastro")
    clock.advance(timedelta(days=3))
    assert write_in(rt, world, "SAIR") == "opted_out"
    with rt.db.connect() as conn:
        document = consent.evidence(conn, world.org_id, contact)
        with pytest.raises(consent.ContactNotFound):
            consent.evidence(conn, other.org_id, contact)  # another org's id: as if it did not exist
    assert document["format"] == "lembra.consent-evidence/1"
    whatsapp = next(c for c in document["consent"] if c["channel_kind"] == "whatsapp")
    assert whatsapp["agreed_at"] == (clock.now() - timedelta(days=3)).isoformat()
    assert (whatsapp["status"], whatsapp["refused_at"]) == ("refused", clock.now().isoformat())
    assert next(c for c in document["consent"] if c["channel_kind"] == "sms")["status"] == "refused"
    scopes = sorted(o["scope"] for o in document["opt_outs"])
    assert scopes == ["address", "address", "contact", "contact", "contact", "reply"]
    [reply] = [o for o in document["opt_outs"] if o["scope"] == "reply"]
    assert reply["source"] == "reply:whatsapp" and reply["evidence"].startswith("inbound:")
    assert document["refused_now"] == ["email", "sms", "whatsapp"]

    # After erasure the CLI still shows the tombstone's record (without the addresses).
    env = lembra_env(rt.settings.database_url)
    runner = CliRunner()
    refused = runner.invoke(main, ["contacts", "erase", "--org", "clinica-a", str(contact)], env=env, input="n\n")
    assert refused.exit_code == 2 and rows(rt, contacts, contacts.c.id == contact)[0].erased_at is None
    erased = runner.invoke(main, ["contacts", "erase", "--org", "clinica-a", str(contact)], env=env, input="y\n")
    assert erased.exit_code == 0, erased.output
    assert f"erased contact {contact}" in erased.output and "Ana" not in erased.output and "99988" not in erased.output
    twice = runner.invoke(main, ["contacts", "erase", "--org", "clinica-a", str(contact), "--yes"], env=env)
    assert twice.exit_code == 2 and "no such contact" in twice.output
    wrong_org = runner.invoke(main, ["contacts", "erase", "--org", "clinica-b", "1", "--yes"], env=env)
    assert wrong_org.exit_code == 2
    shown = runner.invoke(main, ["contacts", "consent", "--org", "clinica-a", str(contact)], env=env)
    assert shown.exit_code == 0, shown.output
    tomb = json.loads(shown.output)
    assert tomb["contact"]["erased_by"].startswith("cli") and tomb["contact"]["phone"] is None
    assert tomb["refused_now"] == ["email", "sms", "whatsapp"]  # its own record says so
    assert {o["address_kept"] for o in tomb["opt_outs"] if o["scope"] == "address"} == {"hashed"}
    with rt.db.connect() as conn:
        [entry] = conn.execute(select(audit_log).where(audit_log.c.action == "erase")).all()
        assert entry.entity_id == contact and entry.changes["erased_by"].startswith("cli")
        assert conn.execute(select(func.count()).select_from(contacts).where(
            contacts.c.org_id == other.org_id)).scalar_one() == 0


def test_lembra_contacts_duplicates_lists_ids_only(rt, clock):
    world, _ = clinic(rt, "clinica-a")
    first = world.contact(name="Marta", phone=PHONE, email=None)
    second = world.contact(name="Lucas", phone=PHONE, email=None)
    result = CliRunner().invoke(main, ["contacts", "duplicates", "--org", "clinica-a"],
                                env=lembra_env(rt.settings.database_url))
    assert result.exit_code == 0 and result.output.strip() == f"2 contacts share a phone: {first} {second}"
