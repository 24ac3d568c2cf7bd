"""Evolution API v2 (unofficial WhatsApp through Baileys): see `provider.py`."""
