"""What a clinic types to set up an e-mail channel (SMTP or Resend), and where each value is found."""

from __future__ import annotations

from gateway.contract import CredentialField, N_

_EMAIL = r"[^@\s]+@[^@\s]+\.[^@\s]+"

SMTP_FIELDS: tuple[CredentialField, ...] = (
    CredentialField(
        "host", N_("Servidor SMTP"),
        N_("O servidor de saída do seu provedor de e-mail, por exemplo smtp.gmail.com, "
           "smtp.office365.com ou o que a sua hospedagem informa em \"configurar cliente de e-mail\"."),
        pattern=r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]", example="smtp.gmail.com",
        address="host"),
    CredentialField(
        "port", N_("Porta"),
        N_("587 com STARTTLS (o mais comum) ou 465 com SSL. Veja nas instruções do seu provedor."),
        pattern=r"[1-9]\d{0,4}", example="587", endpoint=True),
    CredentialField(
        "security", N_("Segurança"),
        N_("STARTTLS para a porta 587, SSL para a porta 465. Sem criptografia, só numa rede de testes."),
        choices=("starttls", "ssl", "none"), endpoint=True),
    CredentialField(
        "from_email", N_("E-mail do remetente"),
        N_("O endereço que os pacientes veem no \"De:\". Precisa ser aceito pelo servidor SMTP (em geral, "
           "a própria conta ou um alias dela)."),
        pattern=_EMAIL, example="agenda@suaclinica.com.br"),
    CredentialField(
        "from_name", N_("Nome do remetente"), N_("Por exemplo, o nome da clínica."),
        required=False, max_length=200),
    CredentialField(
        "username", N_("Usuário"),
        N_("O usuário da conta de e-mail (em geral o próprio endereço). Deixe em branco se o servidor "
           "não pede login."),
        required=False, max_length=320),
    CredentialField(
        "password", N_("Senha"),
        N_("A senha da conta. No Gmail e no Outlook com verificação em duas etapas, crie uma \"senha de "
           "app\" nas configurações de segurança da conta e use-a aqui."),
        required=False, secret=True),
)

RESEND_FIELDS: tuple[CredentialField, ...] = (
    CredentialField(
        "api_key", N_("Chave de API"),
        N_("No painel do Resend (resend.com): API Keys > Create API Key. Começa com re_. Uma chave só de "
           "envio (Sending access) basta."),
        secret=True, pattern=r"re_[A-Za-z0-9_]{8,200}", example="re_123abc…"),
    CredentialField(
        "from_email", N_("E-mail do remetente"),
        N_("Um endereço de um domínio verificado no Resend (painel: Domains)."),
        pattern=_EMAIL, example="agenda@suaclinica.com.br"),
    CredentialField(
        "from_name", N_("Nome do remetente"), N_("Por exemplo, o nome da clínica."),
        required=False, max_length=200),
    CredentialField(
        "webhook_secret", N_("Segredo de assinatura do webhook"),
        N_("No painel do Resend: Webhooks > Add Endpoint com a URL do webhook deste canal; depois abra o "
           "endpoint e copie o Signing Secret (começa com whsec_)."),
        secret=True, pattern=r"whsec_[A-Za-z0-9+/=]{16,200}"),
    CredentialField(
        "base_url", N_("Endereço da API (avançado)"),
        N_("Só para testes ou proxy: deixe em branco para usar api.resend.com."),
        required=False, pattern=r"https?://\S+", address="url", advanced=True),
)
