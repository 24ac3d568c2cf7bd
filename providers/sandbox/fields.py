"""The sandbox needs nothing typed: its webhook secret is generated when the channel is created."""

from __future__ import annotations

from gateway.contract import CredentialField, N_

FIELDS: tuple[CredentialField, ...] = (
    CredentialField(
        "webhook_secret", N_("Segredo do webhook"),
        N_("Deixe em branco: o Lembra gera um. O sandbox não envia nada de verdade; as respostas "
           "digitadas na caixa do sandbox passam pelo mesmo caminho de um webhook real."),
        required=False, secret=True, pattern=r"\S{16,512}", advanced=True, generated=True),
)
