"""Speech to text over any OpenAI-compatible `POST {base}/audio/transcriptions` server (OpenAI's
Whisper, a self-hosted faster-whisper / whisper.cpp server, vLLM): the org's transcription setting.

One multipart request per voice note, `max_retries=0` (a failure goes to a person, it is not
retried blind), the whole call bounded by `timeout`. The key is sealed for the org's row and the
endpoint it was typed for, like an agent's LLM key (`factory.seal_api_key`). Neither the audio nor
the transcript is ever logged; a failure is a typed `TranscriptionError` with a catalogue code.
"""

from __future__ import annotations

from typing import Any

import openai

from gateway.crypto import CryptoError, Keyring
from gateway.egress import STRICT, EgressPolicy, EgressRefused, InvalidAddress, endpoint, httpx_client

__all__ = ["TranscriptionError", "Transcriber", "seal_transcription_key", "transcriber_for"]

_TABLE = "orgs"
#: The longest transcript kept (a two-minute voice note is a few hundred words).
MAX_TRANSCRIPT_CHARS = 4000


class TranscriptionError(Exception):
    """The server could not transcribe; `code` is a catalogue code (voice_transcription_failed,
    voice_transcription_timeout, voice_transcription_unavailable)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Transcriber:
    """One org's transcription server."""

    def __init__(self, base_url: str, api_key: str | None, model: str, *, timeout: float = 60.0,
                 egress: EgressPolicy = STRICT) -> None:
        # "none" keeps the client from falling back to the process's OPENAI_API_KEY (a keyless server).
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout, max_retries=0,
                                     http_client=httpx_client(egress, timeout=timeout))
        self.model = model

    def transcribe(self, audio: bytes, mime_type: str, *, language: str = "pt") -> str:
        """The transcript of `audio` (stripped, possibly empty); raises TranscriptionError."""
        name = "voice" + _extension(mime_type)
        try:
            answer: Any = self._client.audio.transcriptions.create(
                model=self.model, file=(name, audio, mime_type), language=language, response_format="json")
        except openai.APITimeoutError:
            raise TranscriptionError("voice_transcription_timeout") from None
        except (openai.APIError, EgressRefused, ValueError, TypeError):
            # The error's text may quote the server's body; only the code goes on.
            raise TranscriptionError("voice_transcription_failed") from None
        text = getattr(answer, "text", None)
        if not isinstance(text, str):
            raise TranscriptionError("voice_transcription_failed")
        return text.strip()[:MAX_TRANSCRIPT_CHARS]

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()


def transcriber_for(org: Any, keyring: Keyring, *, timeout: float = 60.0,
                    egress: EgressPolicy = STRICT) -> Transcriber | None:
    """The org's transcriber, or None when it has none (the default: voice notes go to a person).
    Raises TranscriptionError("voice_transcription_unavailable") for a setting that cannot be used
    (a URL refused, a key that does not decrypt)."""
    base_url = (getattr(org, "transcription_base_url", None) or "").strip()
    model = (getattr(org, "transcription_model", None) or "").strip()
    if not base_url or not model:
        return None
    try:
        endpoint(base_url)
        api_key = _open_key(org, keyring, base_url)
        return Transcriber(base_url, api_key, model, timeout=timeout, egress=egress)
    except (InvalidAddress, CryptoError, ValueError):
        raise TranscriptionError("voice_transcription_unavailable") from None


def seal_transcription_key(keyring: Keyring, *, org_id: int, api_key: str, base_url: str) -> tuple[bytes, int]:
    """`(transcription_api_key, transcription_key_version)` for the org's row, usable with `base_url` only."""
    sealed = keyring.seal({"api_key": api_key, "endpoint": _endpoint_of(base_url)}, table=_TABLE, org_id=org_id,
                          row_id=org_id)
    return sealed.ciphertext, sealed.key_version


def _open_key(org: Any, keyring: Keyring, base_url: str) -> str | None:
    if org.transcription_api_key is None:
        return None
    if org.transcription_key_version is None:
        raise CryptoError("a sealed key without its key version")
    data = keyring.open(bytes(org.transcription_api_key), key_version=org.transcription_key_version, table=_TABLE,
                        org_id=org.id, row_id=org.id)
    if not isinstance(data, dict) or data.get("endpoint") != _endpoint_of(base_url):
        raise CryptoError("the key was typed for another endpoint")
    key = data.get("api_key")
    return key if isinstance(key, str) and key else None


def _endpoint_of(base_url: str) -> str:
    where = endpoint(base_url)
    return f"{where.scheme}://{where.host}:{where.port}"


def _extension(mime_type: str) -> str:
    kind = mime_type.split(";", 1)[0].strip().lower()
    return {"audio/ogg": ".ogg", "audio/opus": ".ogg", "audio/mpeg": ".mp3", "audio/mp4": ".m4a",
            "audio/aac": ".aac", "audio/amr": ".amr", "audio/wav": ".wav", "audio/webm": ".webm"}.get(kind, ".ogg")
