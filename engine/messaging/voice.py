"""Voice notes (issue 34, docs/conversations.md "Voice notes"): a patient's audio reply is
downloaded through its channel's provider, transcribed by the org's OpenAI-compatible
transcription server, and its transcript then read by `process_inbound` exactly as a text.

The webhook only stores the reply with `voice_state = 'pending'` and the provider's media handle;
`prepare` runs in the inbound worker, before the reply is acted on. It ends in one of two states,
written by compare-and-set on `pending` (so a crash in the middle re-runs the download and the
call, and a second run never stores a second transcript nor advances twice):

- `transcribed`: `text` is the transcript, the audio kept for the console's player;
- `needs_person` with a catalogue reason (`voice_*`): no transcription server (the default), the
  server failed or was slow, the audio was too large or too long, or the provider would not give
  it. `process_inbound` then routes the reply to a person (`route_to_person`): never read as a
  silence or as an unknown answer.

A provider that keeps failing with transient errors is retried by the actor and the repoke sweep
up to MAX_DOWNLOAD_ATTEMPTS, then the reply goes to a person too. Audio and transcripts are never
logged; `voice_reason` is a code.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from engine.core.errors import SettingRefused
from engine.flows.ai.transcribe import TranscriptionError, seal_transcription_key, transcriber_for
from engine.flows.contact_events import record_contact_event
from engine.store.models import channels, inbound_messages, orgs
from engine.store.runtime import Runtime
from gateway.contract import Media, MediaRef
from gateway.crypto import Keyring
from gateway.egress import EgressPolicy, EgressRefused, InvalidAddress, check_saved_url, secrets_follow
from gateway.errors import PermanentError

log = logging.getLogger(__name__)

#: The largest voice note downloaded (WhatsApp's own limit for audio is 16 MB): reading stops there.
MAX_AUDIO_BYTES = 16 * 1024 * 1024
#: The longest voice note transcribed, by the length the webhook says (Evolution's `seconds`).
MAX_SECONDS = 5 * 60
#: Downloads tried (each run of `prepare` counts one) before a person gets the reply instead.
MAX_DOWNLOAD_ATTEMPTS = 5
#: Whole-call budget of one transcription request.
TRANSCRIPTION_TIMEOUT = 60.0
#: The outcome of a voice note a person must hear (in conversations.NEEDS_PERSON).
VOICE_OUTCOME = "voice_note"


def configure_transcription(conn: Connection, keyring: Keyring, org_id: int, *, base_url: str | None,
                            model: str | None, api_key: str | None = None, keep_key: bool = False,
                            egress: EgressPolicy | None = None) -> bool:
    """Set (or, with no base URL, clear) the org's transcription server: an OpenAI-compatible base
    URL (``https://api.openai.com/v1``, a self-hosted Whisper server's ``http://whisper:8000/v1``),
    its model (``whisper-1``) and key (sealed for the org and this URL; none for a keyless server).

    The URL is checked like every tenant-typed address (`check_saved_url`: with `egress`, the
    process's policy, a host that resolves inside the network is refused now; each call goes
    through the guard again). A refusal is a SettingRefused and writes nothing. With `keep_key`
    and no `api_key`, the stored key stays while the URL points where it pointed
    (`secrets_follow`); to another server it is dropped, never sent there. Returns True when it was."""
    base_url, model = (base_url or "").strip() or None, (model or "").strip() or None
    api_key = (api_key or "").strip() or None
    sealed: tuple[bytes | None, int | None] = (None, None)
    dropped = False
    if base_url is not None:
        if model is None:
            raise SettingRefused("transcription_model", "transcription_model_required",
                                 "transcription model is required with a base URL")
        try:
            check_saved_url(base_url, egress)
        except InvalidAddress as exc:
            raise SettingRefused("transcription_base_url", exc.code,
                                 "transcription base URL is not a valid http(s) URL") from None
        except EgressRefused:
            raise SettingRefused("transcription_base_url", "egress_refused",
                                 "transcription base URL points inside the network") from None
        if api_key:
            sealed = seal_transcription_key(keyring, org_id=org_id, api_key=api_key, base_url=base_url)
        elif keep_key:
            before = conn.execute(select(orgs.c.transcription_base_url, orgs.c.transcription_api_key,
                                         orgs.c.transcription_key_version).where(orgs.c.id == org_id)).first()
            if before is not None and before.transcription_api_key is not None:
                if secrets_follow({"url": before.transcription_base_url}, {"url": base_url}):
                    sealed = (bytes(before.transcription_api_key), before.transcription_key_version)
                else:
                    dropped = True
    conn.execute(update(orgs).where(orgs.c.id == org_id).values(
        transcription_base_url=base_url, transcription_model=model if base_url else None,
        transcription_api_key=sealed[0], transcription_key_version=sealed[1]))
    return dropped


def pending_values(audio: MediaRef | None) -> dict[str, Any]:
    """The columns a stored inbound row gets for a voice note (none for any other message)."""
    if audio is None:
        return {}
    return {"media_id": audio.media_id[:200], "media_mime": audio.mime_type, "media_seconds": audio.seconds,
            "media_size": audio.size, "voice_state": "pending"}


def prepare(rt: Runtime, inbound_id: int) -> str | None:
    """Download and transcribe the voice note of one stored reply, once; returns the state it
    reached (None when the reply is no pending voice note). Raises TransientError while the
    provider is unreachable and attempts are left: the actor retries, the repoke sweep comes back."""
    with rt.db.connect() as conn:  # a read first: a text reply (nearly all) takes no write lock here
        pending = conn.execute(select(inbound_messages.c.id).where(
            inbound_messages.c.id == inbound_id, inbound_messages.c.voice_state == "pending",
            inbound_messages.c.processed_at.is_(None))).first()
    if pending is None:
        return None
    with rt.db.begin() as conn:
        row = conn.execute(
            update(inbound_messages)
            .where(inbound_messages.c.id == inbound_id, inbound_messages.c.voice_state == "pending",
                   inbound_messages.c.processed_at.is_(None))
            .values(voice_attempts=inbound_messages.c.voice_attempts + 1)
            .returning(inbound_messages.c.org_id, inbound_messages.c.channel_id, inbound_messages.c.media_id,
                       inbound_messages.c.media_mime, inbound_messages.c.media_seconds,
                       inbound_messages.c.media_size, inbound_messages.c.voice_attempts)).first()
        if row is None:
            return None
        org = conn.execute(select(orgs).where(orgs.c.id == row.org_id)).one()
        channel = conn.execute(select(channels).where(channels.c.org_id == row.org_id,
                                                      channels.c.id == row.channel_id)).one()
    if row.media_seconds is not None and row.media_seconds > MAX_SECONDS:
        return _finish(rt, row.org_id, inbound_id, "needs_person", "voice_too_long")
    try:
        transcriber = transcriber_for(org, rt.keyring, timeout=TRANSCRIPTION_TIMEOUT, egress=rt.settings.egress)
        unusable = None
    except TranscriptionError as exc:
        transcriber, unusable = None, exc.code
    ref = MediaRef(media_id=row.media_id or "", mime_type=row.media_mime, seconds=row.media_seconds,
                   size=row.media_size)
    try:
        media = rt.providers.get(channel).fetch_media(ref, max_bytes=MAX_AUDIO_BYTES)
    except PermanentError as exc:
        log.info("voice note not downloaded", extra={"inbound_id": inbound_id, "code": exc.code})
        return _finish(rt, row.org_id, inbound_id, "needs_person",
                       "voice_too_large" if exc.code == "media_too_large" else "voice_download_failed")
    except Exception as exc:  # transient (or unexpected): try again, a bounded number of times
        if row.voice_attempts >= MAX_DOWNLOAD_ATTEMPTS:
            log.info("voice note download gave up", extra={"inbound_id": inbound_id,
                                                           "code": getattr(exc, "code", type(exc).__name__)})
            return _finish(rt, row.org_id, inbound_id, "needs_person", "voice_download_failed")
        raise
    if len(media.content) > MAX_AUDIO_BYTES:
        return _finish(rt, row.org_id, inbound_id, "needs_person", "voice_too_large")
    if transcriber is None:
        return _finish(rt, row.org_id, inbound_id, "needs_person", unusable or "voice_no_transcriber", media)
    try:
        text = transcriber.transcribe(media.content, media.mime_type)
    except TranscriptionError as exc:
        log.info("voice note not transcribed", extra={"inbound_id": inbound_id, "code": exc.code})
        return _finish(rt, row.org_id, inbound_id, "needs_person", exc.code, media)
    finally:
        transcriber.close()
    if not text:
        return _finish(rt, row.org_id, inbound_id, "needs_person", "voice_transcript_empty", media)
    return _finish(rt, row.org_id, inbound_id, "transcribed", None, media, text)


def _finish(rt: Runtime, org_id: int, inbound_id: int, state: str, reason: str | None,
            media: Media | None = None, text: str | None = None) -> str:
    values: dict[str, Any] = {"voice_state": state, "voice_reason": reason}
    if media is not None:
        values.update(audio=media.content, media_mime=media.mime_type)
    if text is not None:
        values["text"] = text
    with rt.db.begin() as conn:
        # Compare-and-set: a run that lost the race (or a re-run after a crash past this point) stores nothing.
        conn.execute(update(inbound_messages)
                     .where(inbound_messages.c.org_id == org_id, inbound_messages.c.id == inbound_id,
                            inbound_messages.c.voice_state == "pending")
                     .values(**values))
    log.info("voice note prepared", extra={"inbound_id": inbound_id, "state": state, "code": reason})
    return state


def needs_person(inbound: Any) -> bool:
    """Whether this stored reply is a voice note a person must hear (not transcribed)."""
    return getattr(inbound, "voice_state", None) in ("needs_person", "pending")


def route_to_person(conn: Connection, org_id: int, contact_id: int | None) -> str:
    """Hand the conversation to a person, as a flow's hand-off does: the contact's runs follow
    their flow's hand-off policy (paused by default, so no silence timer reads the audio as no
    reply), and the reply waits in Conversas with "Áudio recebido — ouça e responda."."""
    if contact_id is not None:
        record_contact_event(conn, org_id=org_id, contact_id=contact_id, type="handoff_started")
    return VOICE_OUTCOME
