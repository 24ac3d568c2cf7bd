"""What a clinic types to set up an SMS channel (Twilio or Zenvia), and where each value is found."""

from __future__ import annotations

from gateway.contract import CredentialField, N_

_E164_OR_ALPHA = r"\+[1-9]\d{6,14}|[A-Za-z0-9 ]{1,11}"

TWILIO_FIELDS: tuple[CredentialField, ...] = (
    CredentialField(
        "account_sid", N_("Account SID"),
        N_("No console da Twilio (console.twilio.com), na página inicial, em Account Info. Começa com AC."),
        pattern=r"AC[0-9a-fA-F]{32}", example="AC0123456789abcdef0123456789abcdef"),
    CredentialField(
        "auth_token", N_("Auth Token"),
        N_("No mesmo quadro Account Info do console da Twilio, clique em mostrar o Auth Token."),
        secret=True, pattern=r"[0-9a-fA-F]{32}"),
    CredentialField(
        "from", N_("Número remetente"),
        N_("Um número comprado na Twilio (Phone Numbers > Manage > Active numbers), no formato +5511…. "
           "Preencha este ou o Messaging Service SID."),
        pattern=_E164_OR_ALPHA, example="+5511999990000", unless="messaging_service_sid"),
    CredentialField(
        "messaging_service_sid", N_("Messaging Service SID"),
        N_("Opcional, no lugar do número: Messaging > Services na Twilio. Começa com MG."),
        required=False, pattern=r"MG[0-9a-fA-F]{32}"),
    CredentialField(
        "base_url", N_("Endereço da API (avançado)"),
        N_("Só para testes ou proxy: deixe em branco para usar api.twilio.com."),
        required=False, pattern=r"https?://\S+", address="url", advanced=True),
)

ZENVIA_FIELDS: tuple[CredentialField, ...] = (
    CredentialField(
        "api_token", N_("Token da API"),
        N_("No painel da Zenvia (app.zenvia.com): Desenvolvedores > Tokens e webhooks > Criar novo token."),
        secret=True, pattern=r"\S{10,512}"),
    CredentialField(
        "from", N_("Remetente (alias)"),
        N_("O remetente de SMS da sua conta Zenvia: Canais > SMS, o nome (keyword/alias) que aparece lá."),
        pattern=r"\S{1,64}", example="suaclinica"),
    CredentialField(
        "webhook_secret", N_("Segredo do webhook"),
        N_("Uma senha que você inventa (pelo menos 16 caracteres). Ao criar as assinaturas de webhook na "
           "Zenvia, com a URL do webhook deste canal, envie-a no cabeçalho X-Lembra-Webhook-Secret. Sem ela "
           "as respostas dos pacientes são recusadas."),
        required=False, secret=True, pattern=r"\S{16,512}"),
    CredentialField(
        "signature_secret", N_("Segredo do token de assinatura"),
        N_("Só se o token da Zenvia é um token de assinatura: o segredo mostrado ao criá-lo."),
        required=False, secret=True, advanced=True),
    CredentialField(
        "base_url", N_("Endereço da API (avançado)"),
        N_("Só para testes ou proxy: deixe em branco para usar api.zenvia.com."),
        required=False, pattern=r"https?://\S+", address="url", advanced=True),
)
