"""What a clinic types to set up an Evolution API channel, and where each value is found."""

from __future__ import annotations

from gateway.contract import CredentialField, N_

FIELDS: tuple[CredentialField, ...] = (
    CredentialField(
        "base_url", N_("Endereço do servidor Evolution"),
        N_("O endereço público do seu servidor Evolution API v2, com https://. É o mesmo endereço que "
           "abre o painel (Manager) do Evolution, sem /manager no fim."),
        pattern=r"https?://[^\s/?#]+(?::\d{1,5})?(?:/[^\s?#]*)?", example="https://evolution.suaclinica.com.br",
        address="url"),
    CredentialField(
        "api_key", N_("Chave de API (apikey)"),
        N_("A chave global do servidor: a variável AUTHENTICATION_API_KEY do Evolution (arquivo .env do "
           "servidor). Com ela o Lembra também cria a instância por esta página."),
        secret=True, pattern=r"\S{1,512}"),
    CredentialField(
        "instance", N_("Nome da instância"),
        N_("Um nome curto para o WhatsApp da clínica no Evolution, por exemplo clinica-centro. Se a "
           "instância ainda não existe, o Lembra a cria depois de salvar, no botão Criar instância."),
        pattern=r"[^/?#\s][^/?#]{0,99}", example="clinica-centro"),
    CredentialField(
        "webhook_secret", N_("Segredo do webhook"),
        N_("Deixe em branco: o Lembra gera um segredo e o registra no Evolution ao criar a instância. "
           "Informe um só se a instância já tem um webhook configurado com um segredo próprio."),
        required=False, secret=True, pattern=r"\S{16,512}", generated=True),
)
