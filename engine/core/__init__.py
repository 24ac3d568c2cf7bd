"""What every package stands on and nothing else: the clock, settings, ids, logging, redaction, metrics, strict JSON and the domain error."""
