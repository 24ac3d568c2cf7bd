"""The Configuração menu: reminder rules (rules.py), message templates (templates.py), channels
(channels/), API keys and users (access.py) and the audit log (audit.py)."""
