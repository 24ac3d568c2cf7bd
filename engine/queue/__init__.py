"""The outbox every send goes through (one `messages` row per send and its transitions) and what gates it: address opt-outs, pacing, Meta's conversation window; the operator's inbox."""
