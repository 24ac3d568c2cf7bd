"""The sandbox provider: records every message instead of sending it (the embedded default)."""
