"""The Mensagens menu: the queue and the sent log (outbox.py) and the sandbox's inbox (sandbox.py)."""
