"""Voice notes in the console (issue 34): the thread says a reply was a voice note and plays its
audio from an org-scoped, login-protected route; another org's id (or audio retention removed)
answers 404."""

from __future__ import annotations

from sqlalchemy import insert, update

from engine.core import clock
from engine.store.models import inbound_messages

AUDIO = b"OggS\x00\x02not-really-opus" * 8


def voice_reply(rt, tenant, mid: str, state: str, reason: str | None) -> int:
    now = clock.now()
    with rt.db.begin() as conn:
        return conn.execute(insert(inbound_messages).values(
            org_id=tenant.world.org_id, channel_id=tenant.channel_id, provider_message_id=mid,
            from_address="+5516999887766", contact_id=tenant.contact_id, received_at=now, processed_at=now,
            outcome="voice_note", media_id=mid, media_mime="audio/ogg; codecs=opus", audio=AUDIO,
            voice_state=state, voice_reason=reason).returning(inbound_messages.c.id)).scalar_one()


def test_the_audio_plays_for_its_org_only(rt, app, tenants, agent):
    a, b = tenants
    mine = voice_reply(rt, a, "wamid.A", "needs_person", "voice_no_transcriber")
    theirs = voice_reply(rt, b, "wamid.B", "needs_person", "voice_no_transcriber")
    voice_reply(rt, a, "wamid.A2", "transcribed", None)

    page = agent.get(f"/admin/conversations/{mine}/").text
    assert "Transcrito de um áudio." in page
    assert "Áudio recebido — ouça e responda." in page and f'/admin/conversations/{mine}/audio/' in page
    heard = agent.get(f"/admin/conversations/{mine}/audio/")
    assert heard.status_code == 200 and heard.data == AUDIO and heard.mimetype == "audio/ogg"
    assert "no-store" in heard.headers["Cache-Control"]

    assert agent.get(f"/admin/conversations/{theirs}/audio/").status_code == 404
    assert agent.get("/admin/conversations/nope/audio/").status_code == 404
    assert app.test_client().get(f"/admin/conversations/{mine}/audio/").status_code in (302, 401)

    with rt.db.begin() as conn:  # retention cleared it
        conn.execute(update(inbound_messages).where(inbound_messages.c.id == mine).values(audio=None))
    assert agent.get(f"/admin/conversations/{mine}/audio/").status_code == 404
