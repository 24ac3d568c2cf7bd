"""What a clinic types to set up a Meta WhatsApp Cloud API channel, and where each value is found."""

from __future__ import annotations

from gateway.contract import CredentialField, N_

FIELDS: tuple[CredentialField, ...] = (
    CredentialField(
        "phone_number_id", N_("Identificação do número de telefone"),
        N_("No painel do app em developers.facebook.com: WhatsApp > Configuração da API, campo "
           "\"Identificação do número de telefone\" (Phone number ID). Só dígitos; não é o número em si."),
        pattern=r"\d{5,20}", example="106540352242922"),
    CredentialField(
        "access_token", N_("Token de acesso permanente"),
        N_("No Gerenciador de Negócios (business.facebook.com): Configurações do negócio > Usuários do "
           "sistema > Gerar novo token, com as permissões whatsapp_business_messaging e "
           "whatsapp_business_management. O token temporário da Configuração da API expira em 24 horas."),
        secret=True, pattern=r"[A-Za-z0-9_\-.|]{20,2048}"),
    CredentialField(
        "app_secret", N_("Chave secreta do app"),
        N_("No painel do app: Configurações do app > Básico > Chave secreta do app (App secret), 32 "
           "caracteres. O Lembra a usa para conferir a assinatura de cada webhook."),
        secret=True, pattern=r"[0-9a-fA-F]{32}"),
    CredentialField(
        "verify_token", N_("Token de verificação do webhook"),
        N_("Uma senha que você inventa (pelo menos 16 caracteres) e escreve também no painel do app: "
           "WhatsApp > Configuração > Webhook > Verificar token, junto com a URL do webhook deste canal."),
        secret=True, pattern=r"\S{16,512}"),
    CredentialField(
        "waba_id", N_("Identificação da conta do WhatsApp Business (WABA)"),
        N_("No painel do app em developers.facebook.com: WhatsApp > Configuração da API, campo "
           "\"Identificação da conta do WhatsApp Business\" (WhatsApp Business Account ID). Só dígitos. Com "
           "ela o Lembra lista os modelos aprovados da conta em Modelos, para você escolher em vez de digitar, "
           "e confere cada modelo ao salvar."),
        required=False, pattern=r"\d{5,20}", example="102290129340398"),
    CredentialField(
        "api_version", N_("Versão da Graph API"),
        N_("Deixe em branco para usar a versão que o Lembra conhece."),
        required=False, pattern=r"v\d{1,3}\.\d{1,2}", example="v21.0", advanced=True),
    CredentialField(
        "base_url", N_("Endereço da API (avançado)"),
        N_("Só para testes ou proxy: deixe em branco para usar graph.facebook.com."),
        required=False, pattern=r"https?://\S+", address="url", advanced=True),
)
