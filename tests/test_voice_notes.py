"""Issue 34, voice notes: an audio reply is downloaded through its provider (Evolution's base64
endpoint, Meta's media id → url), transcribed by the org's OpenAI-compatible server, and read like
text; without a server, or when a step fails, it goes to a person with a catalogue reason.
Loopback fakes speak the wire formats (tests/fakes: evolution, meta, llm's /audio/transcriptions).
End to end: a no-show's rebook flow on the built-in path (no model) books from a voice note."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from engine.core import clock as engine_clock
from engine.core.errors import DomainError
from engine.flows.conversation.fields import create_field
from engine.messaging import inbound as inbound_module
from engine.messaging import voice
from engine.messaging.conversations import waiting_for_person
from engine.messaging.inbound import process_inbound, receive
from engine.people.agenda import create_professional
from engine.people.appointments import set_status
from engine.privacy import retention
from engine.store.models import appointments, contact_events, enrollments, inbound_messages, messages
from engine.tenants.channels import create_channel
from gateway.contract import WebhookRequest
from gateway.errors import TransientError
from tests.factories import World
from tests.fakes.evolution import EvolutionFake, envelope, error, mint_token, upsert
from tests.fakes.llm import Error, LLMFake, Slow
from tests.fakes.meta import FakeGraph, sample_json
from tests.flows.helpers import Flows
from tests.flows.test_scenarios import DIA, PERIODO, SP, _rebook

EVO_SECRET = "evo-webhook-secret-0123456789abcdef"
APP_SECRET = "meta-app-secret"
PHONE = "+5516999887766"
AUDIO = b"OggS\x00\x02voice-bytes-of-the-patient" * 40
TRANSCRIPT = "ok"


def evolution_world(rt, server, slug: str = "clinica") -> tuple[World, int, int]:
    world = World(rt, slug)
    with rt.db.begin() as conn:
        channel_id = create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="evolution",
                                    name="evolution", credentials={
                                        "base_url": server.url, "api_key": "global-api-key", "instance": "clinica",
                                        "webhook_secret": EVO_SECRET})
    contact = world.contact(phone=PHONE)
    appointment = world.appointment(contact, engine_clock.now() + timedelta(days=2))
    return world, channel_id, appointment


def with_transcriber(rt, world: World, llm: LLMFake) -> None:
    with rt.db.begin() as conn:
        voice.configure_transcription(conn, rt.keyring, world.org_id, base_url=llm.base_url, model="whisper-1",
                                      api_key="sk-whisper")


def evolution_audio(rt, channel_id: int, *, message_id: str = "3A5F1C2B9D8E7F60A1B2", seconds: int = 4,
                    size: int | None = None) -> list[int]:
    audio = {"url": "https://mmg.whatsapp.net/v/t62.7117-24/x.enc", "mimetype": "audio/ogg; codecs=opus",
             "seconds": seconds, "ptt": True}
    if size is not None:
        audio["fileLength"] = str(size)
    data = upsert({"audioMessage": audio}, message_id=message_id, message_type="audioMessage")
    raw = json.dumps(envelope("messages.upsert", data)).encode()
    request = WebhookRequest("POST", f"/webhooks/evolution/{channel_id}",
                             {"Authorization": f"Bearer {mint_token(EVO_SECRET)}"}, raw)
    return receive(rt, "evolution", channel_id, request).inbound_ids


def row(rt, inbound_id: int) -> Any:
    with rt.db.connect() as conn:
        return conn.execute(select(inbound_messages).where(inbound_messages.c.id == inbound_id)).one()


def status_of(rt, appointment_id: int) -> str:
    with rt.db.connect() as conn:
        return conn.execute(select(appointments.c.status).where(appointments.c.id == appointment_id)).scalar_one()


def handoffs(rt, org_id: int) -> int:
    with rt.db.connect() as conn:
        return len(conn.execute(select(contact_events.c.id).where(contact_events.c.org_id == org_id,
                                                                   contact_events.c.type == "handoff_started")).all())


def test_an_evolution_voice_note_is_transcribed_and_confirms_once_even_after_a_crash(rt, serve, monkeypatch, caplog):
    fake = EvolutionFake(media={"3A5F1C2B9D8E7F60A1B2": AUDIO})
    with serve(fake) as server, LLMFake(transcribe=lambda audio: TRANSCRIPT if audio == AUDIO else "") as llm:
        world, channel_id, appointment = evolution_world(rt, server)
        with_transcriber(rt, world, llm)
        [inbound_id] = evolution_audio(rt, channel_id)
        assert row(rt, inbound_id).voice_state == "pending" and row(rt, inbound_id).text is None

        # A crash after the transcript is stored, before the reply is acted on: the re-run reads the
        # stored transcript, neither transcribing again nor confirming twice.
        real_act = inbound_module._act
        monkeypatch.setattr(inbound_module, "_act", lambda conn, inbound: 1 / 0)
        with caplog.at_level(logging.DEBUG), pytest.raises(ZeroDivisionError):
            process_inbound(rt, inbound_id)
        monkeypatch.setattr(inbound_module, "_act", real_act)
        assert process_inbound(rt, inbound_id) == "confirmed"
        assert process_inbound(rt, inbound_id) is None

        [call] = llm.transcriptions
        assert call.audio == AUDIO and call.fields["model"] == "whisper-1" and call.fields["language"] == "pt"
        assert llm.requests[0].header("Authorization") == "Bearer sk-whisper"
        [download] = [r for r in server.requests if "getBase64FromMediaMessage" in r.path]
        assert download.json()["message"]["key"]["id"] == "3A5F1C2B9D8E7F60A1B2"
        stored = row(rt, inbound_id)
        assert (stored.voice_state, stored.voice_reason, stored.text) == ("transcribed", None, TRANSCRIPT)
        assert bytes(stored.audio) == AUDIO and stored.media_seconds == 4
        assert status_of(rt, appointment) == "confirmed"
        logged = " ".join(r.getMessage() + json.dumps(r.__dict__, default=str) for r in caplog.records)
        assert TRANSCRIPT + '"' not in logged and "voice-bytes" not in logged and "99988" not in logged


def test_without_a_transcription_service_the_voice_note_goes_to_a_person(rt, serve):
    fake = EvolutionFake(media={"3A5F1C2B9D8E7F60A1B2": AUDIO})
    with serve(fake) as server:
        world, channel_id, appointment = evolution_world(rt, server)
        [inbound_id] = evolution_audio(rt, channel_id)
        assert process_inbound(rt, inbound_id) == "voice_note"
    stored = row(rt, inbound_id)
    assert (stored.voice_state, stored.voice_reason) == ("needs_person", "voice_no_transcriber")
    assert bytes(stored.audio) == AUDIO, "a person can still listen to it"
    assert status_of(rt, appointment) == "scheduled" and handoffs(rt, world.org_id) == 1
    with rt.db.connect() as conn:
        waiting = conn.execute(select(inbound_messages.c.id).where(waiting_for_person(world.org_id))).scalars().all()
    assert waiting == [inbound_id]


@pytest.mark.parametrize("case, reason", [
    ("server_error", "voice_transcription_failed"),
    ("slow", "voice_transcription_timeout"),
    ("too_large", "voice_too_large"),
    ("too_long", "voice_too_long"),
])
def test_failing_slow_and_oversized_voice_notes_go_to_a_person_with_a_reason(rt, serve, monkeypatch, case, reason):
    fake = EvolutionFake(media={"3A5F1C2B9D8E7F60A1B2": AUDIO})
    answers = {"server_error": (Error(500),), "slow": (Slow(3.0, TRANSCRIPT),)}.get(case, ())
    monkeypatch.setattr(voice, "TRANSCRIPTION_TIMEOUT", 0.5)
    if case == "too_large":
        monkeypatch.setattr(voice, "MAX_AUDIO_BYTES", len(AUDIO) // 2)  # no fileLength: the read stops
    with serve(fake) as server, LLMFake(*answers, transcribe=lambda audio: TRANSCRIPT) as llm:
        world, channel_id, appointment = evolution_world(rt, server)
        with_transcriber(rt, world, llm)
        [inbound_id] = evolution_audio(rt, channel_id, seconds=900 if case == "too_long" else 4)
        assert process_inbound(rt, inbound_id) == "voice_note"
    stored = row(rt, inbound_id)
    assert (stored.voice_state, stored.voice_reason, stored.text) == ("needs_person", reason, None)
    assert status_of(rt, appointment) == "scheduled"


def test_a_provider_that_keeps_failing_is_retried_then_a_person_gets_the_voice_note(rt, serve, monkeypatch):
    monkeypatch.setattr(voice, "MAX_DOWNLOAD_ATTEMPTS", 2)
    fake = EvolutionFake(script=[error(500, ["boom"])] * 2)
    with serve(fake) as server:
        world, channel_id, _ = evolution_world(rt, server)
        [inbound_id] = evolution_audio(rt, channel_id)
        with pytest.raises(TransientError):
            process_inbound(rt, inbound_id)
        assert row(rt, inbound_id).processed_at is None
        assert process_inbound(rt, inbound_id) == "voice_note"
    assert row(rt, inbound_id).voice_reason == "voice_download_failed"


def meta_audio_body(mid: str, media_id: str) -> dict[str, Any]:
    data = copy.deepcopy(sample_json("webhook_inbound_text.json"))
    value = data["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["wa_id"] = PHONE.lstrip("+")
    value["messages"] = [{"from": PHONE.lstrip("+"), "id": mid, "timestamp": "1796126400", "type": "audio",
                          "audio": {"mime_type": "audio/ogg; codecs=opus", "sha256": "x", "id": media_id,
                                    "voice": True}}]
    return data


def test_a_meta_voice_note_is_fetched_by_media_id_with_the_token_and_confirms(rt):
    with FakeGraph() as graph, LLMFake(transcribe=lambda audio: TRANSCRIPT) as llm:
        graph.media["1234567890"] = AUDIO
        world = World(rt)
        with rt.db.begin() as conn:
            channel_id = create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="meta",
                                        name="meta", credentials={
                                            "phone_number_id": "1122334455667", "access_token": "EAAG-token",
                                            "app_secret": APP_SECRET, "verify_token": "v", "base_url": graph.url})
        contact = world.contact(phone=PHONE)
        appointment = world.appointment(contact, engine_clock.now() + timedelta(days=2))
        with_transcriber(rt, world, llm)
        raw = json.dumps(meta_audio_body("wamid.AUDIO1", "1234567890")).encode()
        signature = "sha256=" + hmac.new(APP_SECRET.encode(), raw, hashlib.sha256).hexdigest()
        [inbound_id] = receive(rt, "meta", channel_id, WebhookRequest(
            "POST", "/", {"X-Hub-Signature-256": signature}, raw)).inbound_ids
        assert process_inbound(rt, inbound_id) == "confirmed"
        lookup, download = graph.requests
        assert lookup.path.endswith("/1234567890") and download.path == "/media-download/1234567890"
        assert {lookup.header("Authorization"), download.header("Authorization")} == {"Bearer EAAG-token"}
    assert status_of(rt, appointment) == "confirmed" and bytes(row(rt, inbound_id).audio) == AUDIO


def test_retention_and_erasure_delete_the_audio_and_a_bad_setting_is_refused(rt, serve, clock):
    from engine.privacy.erasure import erase_contact

    fake = EvolutionFake(media={"3A5F1C2B9D8E7F60A1B2": AUDIO, "3A5F1C2B9D8E7F60A1B3": AUDIO})
    with serve(fake) as server:
        world, channel_id, _ = evolution_world(rt, server)
        [inbound_id] = evolution_audio(rt, channel_id)
        process_inbound(rt, inbound_id)
        other = World(rt, "outra")
        with rt.db.begin() as conn:
            other_channel = create_channel(conn, rt.keyring, org_id=other.org_id, kind="whatsapp",
                                           provider="evolution", name="evolution", credentials={
                                               "base_url": server.url, "api_key": "global-api-key",
                                               "instance": "clinica", "webhook_secret": EVO_SECRET})
        other_contact = other.contact(phone=PHONE)
        [erased_id] = evolution_audio(rt, other_channel, message_id="3A5F1C2B9D8E7F60A1B3")
        process_inbound(rt, erased_id)
    assert row(rt, inbound_id).audio is not None and row(rt, erased_id).audio is not None
    with rt.db.begin() as conn:
        erase_contact(conn, other.org_id, other_contact, by="test", keyring=rt.keyring)
    assert row(rt, erased_id).audio is None and row(rt, inbound_id).audio is not None, "the other org's stays"
    clock.advance(timedelta(days=200))
    retention.run_org(rt.db, world.org_id)
    assert row(rt, inbound_id).audio is None
    with rt.db.begin() as conn, pytest.raises(DomainError):
        voice.configure_transcription(conn, rt.keyring, world.org_id, base_url="ftp://whisper", model="whisper-1")


def test_the_cli_sets_the_org_setting_with_the_key_from_stdin_and_clears_it(rt, database_url):
    from click.testing import CliRunner

    from admin.cli import main
    from engine.store.models import orgs
    from tests.processes import lembra_env

    world = World(rt)
    env = lembra_env(database_url)
    done = CliRunner().invoke(main, ["orgs", "transcription", "--org", "clinica", "--url", "https://whisper.example/v1",
                                     "--model", "whisper-1"], input="sk-secret\n", env=env)
    assert done.exit_code == 0 and "sk-secret" not in done.output, done.output
    with rt.db.connect() as conn:
        org = conn.execute(select(orgs).where(orgs.c.id == world.org_id)).one()
    assert org.transcription_model == "whisper-1" and b"sk-secret" not in bytes(org.transcription_api_key)
    assert CliRunner().invoke(main, ["orgs", "transcription", "--org", "clinica", "--clear"], env=env).exit_code == 0
    with rt.db.connect() as conn:
        assert conn.execute(select(orgs.c.transcription_base_url).where(orgs.c.id == world.org_id)).scalar() is None


def test_a_voice_note_rebooks_a_no_show_end_to_end_on_the_built_in_path(rt, serve, clock):
    """A no-show's rebook flow waits on its ask step; the patient answers with a voice note
    ("pode ser sexta de manhã", transcribed), the built-in reader (no model) takes the day and the
    period from it, free times are offered from the built-in agenda, she answers "1" and a new
    appointment is booked."""
    fake = EvolutionFake(media={"3A5F1C2B9D8E7F60A1B2": AUDIO})
    with serve(fake) as server, LLMFake(transcribe=lambda audio: "pode ser sexta de manhã") as llm:
        world = World(rt, quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
        with rt.db.begin() as conn:
            world.channels["whatsapp"] = create_channel(
                conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="evolution", name="evolution",
                is_default=True, credentials={"base_url": server.url, "api_key": "global-api-key",
                                              "instance": "clinica", "webhook_secret": EVO_SECRET})
            for slug, kind, question in (("data", "date", DIA), ("periodo", "period", PERIODO)):
                create_field(conn, world.org_id, {"slug": slug, "label": slug, "type": kind, "question": question})
            professional = create_professional(
                conn, world.org_id, name="Dra. Beatriz Costa", slot_minutes=30,
                hours=[{"weekday": d, "starts": "08:00", "ends": "12:00"} for d in range(5)]).id
        with_transcriber(rt, world, llm)
        contact = world.contact(phone=PHONE)
        missed = world.appointment(contact, engine_clock.now() - timedelta(hours=1), professional_id=professional)
        flows = Flows(world)
        flows.flow(_rebook("data,periodo", "book", before=[]),
                   trigger={"kind": "appointment", "appointment_event": "no_show", "repeat": "always"})
        with rt.db.begin() as conn:  # the receptionist marks "não compareceu"
            set_status(conn, world.org_id, missed, "scheduled", "no_show")
        flows.run()
        with rt.db.connect() as conn:
            [run] = conn.execute(select(enrollments.c.id).where(enrollments.c.org_id == world.org_id)).scalars().all()
        assert flows.enrollment(run).status == "waiting_reply"

        [voice_id] = evolution_audio(rt, world.channels["whatsapp"])
        process_inbound(rt, voice_id)
        assert (row(rt, voice_id).voice_state, row(rt, voice_id).text) == ("transcribed", "pode ser sexta de manhã")
        clock.advance(timedelta(seconds=9))  # past the reply debounce
        flows.run()
        raw = json.dumps(envelope("messages.upsert", upsert({"conversation": "1"},
                                                             message_id="3A5F1C2B9D8E7F60A1B9"))).encode()
        [text_id] = receive(rt, "evolution", world.channels["whatsapp"], WebhookRequest(
            "POST", "/", {"Authorization": f"Bearer {mint_token(EVO_SECRET)}"}, raw)).inbound_ids
        process_inbound(rt, text_id)
        clock.advance(timedelta(seconds=9))
        flows.run()

    with rt.db.connect() as conn:
        sent = conn.execute(select(messages.c.payload).where(messages.c.org_id == world.org_id,
                                                             messages.c.purpose == "followup")
                            .order_by(messages.c.id)).scalars().all()
        booked = conn.execute(select(appointments.c.starts_at, appointments.c.status).where(
            appointments.c.org_id == world.org_id, appointments.c.id != missed)).all()
    texts = [(p or {}).get("text") for p in sent]
    assert texts[0] == DIA and len(texts) == 2 and texts[1].startswith("Tenho estes horários livres:\n")
    assert "1. sexta-feira, 04/12 às 08:00 (Dra. Beatriz Costa)" in texts[1]
    assert [(b.starts_at.astimezone(SP), b.status) for b in booked] == [
        (datetime(2026, 12, 4, 8, 0, tzinfo=SP), "scheduled")]
    assert [(s["node"], s["reason"]) for s in flows.steps(run) if s["node"] != "inicio"][-3:] == [
        ("oferta", "do_slots_offered"), ("oferta", "do_slot_picked"), ("acao", "do_booked")]
