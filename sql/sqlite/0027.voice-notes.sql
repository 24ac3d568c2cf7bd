-- Voice notes (issue 34, docs/conversations.md "Voice notes"): a patient's audio reply is kept on
-- its inbound row, downloaded and transcribed by a worker, and its transcript read like any text.
-- `media_id` is the provider's handle to download it; `audio` its bytes (for the console's player;
-- retention and erasure clear it with the text); `voice_state` pending → transcribed or
-- needs_person; `voice_reason` a catalogue code (never a body); `voice_attempts` counts downloads
-- tried, so a provider that keeps failing ends with a person instead of a loop.
ALTER TABLE inbound_messages ADD COLUMN media_id TEXT;
ALTER TABLE inbound_messages ADD COLUMN media_mime TEXT;
ALTER TABLE inbound_messages ADD COLUMN media_seconds INTEGER;
ALTER TABLE inbound_messages ADD COLUMN media_size BIGINT;
ALTER TABLE inbound_messages ADD COLUMN audio BLOB;
ALTER TABLE inbound_messages ADD COLUMN voice_state TEXT
    CHECK (voice_state IN ('pending', 'transcribed', 'needs_person'));
ALTER TABLE inbound_messages ADD COLUMN voice_reason TEXT;
ALTER TABLE inbound_messages ADD COLUMN voice_attempts INTEGER NOT NULL DEFAULT 0;

-- The org's OpenAI-compatible transcription server (`POST {base}/audio/transcriptions`): none by
-- default, and then every voice note goes to a person. The key is sealed like an agent's LLM key.
ALTER TABLE orgs ADD COLUMN transcription_base_url TEXT;
ALTER TABLE orgs ADD COLUMN transcription_model TEXT;
ALTER TABLE orgs ADD COLUMN transcription_api_key BLOB;
ALTER TABLE orgs ADD COLUMN transcription_key_version INTEGER;
