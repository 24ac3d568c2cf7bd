"""The console's top-level menu, what the front desk acts on: Agendamentos and Contatos
(scheduling.py, with the contact's privacy actions in privacy.py), Conversas (conversations.py),
Pendências (inbox.py) and the Painel (dashboard.py)."""
