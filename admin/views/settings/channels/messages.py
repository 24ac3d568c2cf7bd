"""What the channel pages say about a provider: connection states, errors by code, check results.

A provider's error code the console has no sentence for is shown next to the general sentence
(support can look it up); a code it knows is said in words only. The provider's body never is
shown (it may echo a number or a key).
"""

from __future__ import annotations

from markupsafe import Markup

from admin.i18n import _, _l
from gateway.errors import EgressRefused

#: How the console names each provider (the value stored stays the registry name).
PROVIDER_LABELS = {
    "sandbox": _l("Sandbox (testes: não envia nada)"),
    "evolution": _l("Evolution API (WhatsApp do celular da clínica)"),
    "meta": _l("Meta WhatsApp Cloud API (oficial)"),
    "smtp": _l("SMTP (o e-mail da clínica)"),
    "resend": _l("Resend (e-mail)"),
    "twilio": _l("Twilio (SMS)"),
    "zenvia": _l("Zenvia (SMS)"),
}

#: The phone's link as the console says it (Evolution's states; "error" is Lembra failing to ask).
CONNECTION_LABELS = {
    "open": _l("Conectado"), "connecting": _l("Aguardando leitura do QR"), "close": _l("Desconectado"),
    "refused": _l("Desconectado"), "error": _l("Sem resposta do servidor"),
}
CONNECTION_COLORS = {"open": "success", "connecting": "warning", "close": "danger", "refused": "danger",
                     "error": "secondary"}
#: What a provider error code means for the person linking the phone (the code is shown too).
CONNECT_ERRORS = {
    "unsupported": _l("Este canal não se conecta por QR code: só canais Evolution (o WhatsApp do celular da "
                      "clínica) têm essa etapa."),
    "connection_error": _l("O servidor Evolution não respondeu. Verifique se ele está no ar e se o endereço "
                           "do servidor Evolution, no canal, está certo."),
    "connect_timeout": _l("O servidor Evolution não respondeu. Verifique se ele está no ar e se o endereço "
                          "do servidor Evolution, no canal, está certo."),
    "timeout": _l("O servidor Evolution demorou demais para responder. Tente de novo em instantes."),
    "request_error": _l("O servidor Evolution não respondeu. Verifique se ele está no ar e se o endereço "
                        "do servidor Evolution, no canal, está certo."),
    "unauthorized": _l("O Evolution recusou a chave de API do canal. Confira a chave de API nas credenciais do canal."),
    "forbidden": _l("O Evolution recusou a chave de API do canal. Confira a chave de API nas credenciais do canal."),
    "instance_not_found": _l("A instância configurada no canal não existe no Evolution. Confira o nome da "
                             "instância nas credenciais do canal."),
    "not_found": _l("O endereço do canal não parece ser um servidor Evolution API v2. Confira o endereço do "
                    "servidor Evolution."),
    "not_configured": _l("Faltam credenciais neste canal (endereço do servidor, chave de API ou nome da "
                         "instância). Edite o canal e preencha."),
    "invalid_number": _l("Número de telefone inválido. Informe o número do WhatsApp da clínica com DDD, por "
                         "exemplo +55 16 99999-0000."),
    "connect_failed": _l("O Evolution não conseguiu iniciar a conexão. Tente de novo em alguns segundos."),
    "connection_closed": _l("A conexão do Evolution com o WhatsApp caiu. Gere um novo QR code."),
    "bad_response": _l("O Evolution respondeu algo inesperado. Confira se o servidor é um Evolution API v2."),
    "instance_name_in_use": _l("Já existe uma instância com esse nome no Evolution, e a chave de API não pôde "
                               "configurá-la. Confira o nome da instância ou use a chave global do servidor."),
    "egress_refused": _l("Endereço não permitido: o endereço do servidor deste canal aponta para a rede interna (localhost, "
                         "rede privada ou link-local). Use um endereço público, ou peça a quem opera o Lembra "
                         "para liberá-lo em LEMBRA_PROVIDER_ALLOW."),
}


#: A provider field's choices as the form offers them (the stored value stays the code).
CHOICE_LABELS = {
    "starttls": _l("STARTTLS (porta 587, o mais comum)"),
    "ssl": _l("SSL/TLS (porta 465)"),
    "none": _l("Sem criptografia (só numa rede de testes)"),
}


def status_detail_text(detail: str | None, provider: str | None) -> str:
    """A channel's recorded detail ("connecting", "close:connection_error", a send's error code) in
    words: the phone's link state and, after it, what went wrong."""
    if not detail:
        return "—"
    state, _sep, rest = detail.partition(":")
    if state in CONNECTION_LABELS:
        label = str(CONNECTION_LABELS[state])
        return f"{label}: {provider_error(rest, provider)}" if rest else label
    return provider_error(detail, provider)


def connection_badge(state: str | None) -> Markup:
    """A badge for a connection state ("—" when none is known)."""
    if not state:
        return Markup("—")
    return Markup('<span class="badge badge-{}">{}</span>').format(
        CONNECTION_COLORS.get(state, "light"), CONNECTION_LABELS.get(state, state))


def connect_error(code: str | None) -> str:
    """What went wrong talking to the provider, in the reader's language, with the provider's code
    (never its body: that may echo a number or a key)."""
    code = (code or "").strip()[:60] or "error"
    if code in CONNECT_ERRORS:
        message = str(CONNECT_ERRORS[code])
    elif code in PROVIDER_ERRORS:
        message = str(PROVIDER_ERRORS[code])
    elif code.startswith(("http_5", "http_429")):
        message = _("O servidor Evolution está com problemas. Tente de novo em instantes.")
    else:
        message = _("Não foi possível falar com o servidor Evolution.")
        return _("%(mensagem)s (código: %(codigo)s)", mensagem=message, codigo=code)
    return message


def egress_error(exc: EgressRefused) -> str:
    """A tenant-set address that the egress guard refused, said the same whatever listens there."""
    return _("Endereço não permitido: %(endereco)s. Endereços internos (localhost, redes privadas, link-local) "
             "só podem ser usados se quem opera o Lembra os liberar em LEMBRA_PROVIDER_ALLOW.", endereco=exc.host)


#: Why a provider refused or did not answer, for every provider (send tests, connection checks).
PROVIDER_ERRORS = {
    "invalid_number": _l("O provedor recusou o número: confira o DDD e os dígitos."),
    "invalid_address": _l("O provedor recusou o endereço de e-mail: confira como foi digitado."),
    "config_missing": _l("Faltam credenciais neste canal. Edite o canal e preencha os campos obrigatórios."),
    "not_configured": _l("Faltam credenciais neste canal. Edite o canal e preencha os campos obrigatórios."),
    "misconfigured": _l("Faltam credenciais neste canal. Edite o canal e preencha os campos obrigatórios."),
    "config_invalid": _l("Uma credencial deste canal está em formato inválido. Edite o canal e confira-a."),
    "unauthorized": _l("O provedor recusou as credenciais. Confira a chave ou o token no painel do provedor."),
    "forbidden": _l("O provedor recusou as credenciais. Confira a chave ou o token no painel do provedor."),
    "http_401": _l("O provedor recusou as credenciais. Confira a chave ou o token no painel do provedor."),
    "http_403": _l("O provedor recusou as credenciais. Confira a chave ou o token no painel do provedor."),
    "smtp_535": _l("O servidor de e-mail recusou o usuário ou a senha. Confira-os (no Gmail e no Outlook, use "
                   "uma senha de app)."),
    "auth_unsupported": _l("O servidor de e-mail não aceita login nesta conexão. Confira a porta e a segurança "
                           "(587 com STARTTLS ou 465 com SSL)."),
    "starttls_unsupported": _l("O servidor de e-mail não oferece STARTTLS nesta porta. Use 465 com SSL, ou confira "
                               "a porta."),
    "tls_certificate": _l("O certificado do servidor não confere com o endereço informado. Confira o nome do "
                          "servidor."),
    "tls_error": _l("A conexão segura (TLS) com o servidor falhou. Confira a porta e a segurança."),
    "timeout": _l("O provedor demorou demais para responder. Tente de novo em instantes."),
    "connect_timeout": _l("O provedor não respondeu. Confira o endereço e tente de novo."),
    "connection_error": _l("Não foi possível falar com o provedor. Confira o endereço e tente de novo."),
    "connection_refused": _l("O servidor recusou a conexão. Confira o endereço e a porta."),
    "dns_error": _l("Esse endereço não existe (o nome não foi encontrado). Confira como foi digitado."),
    "http_404": _l("O provedor não encontrou a conta ou o recurso informado. Confira os identificadores."),
    "restricted_api_key": _l("A chave de API só permite envio; a conexão está funcionando."),
    "sandbox_transient": _l("O sandbox está configurado para simular uma falha temporária."),
    "sandbox_permanent": _l("O sandbox está configurado para simular uma falha definitiva."),
}


def provider_error(code: str | None, provider: str | None = None) -> str:
    """What went wrong with a provider, in the reader's language, with its code."""
    code = (code or "").strip()[:60] or "error"
    if provider == "evolution":
        return connect_error(code)
    if code in PROVIDER_ERRORS:
        message = str(PROVIDER_ERRORS[code])
    elif code.startswith(("http_5", "http_429")):
        message = _("O provedor está com problemas ou limitando os pedidos. Tente de novo em instantes.")
    else:
        message = _("O provedor recusou o pedido ou não respondeu como esperado.")
        return _("%(mensagem)s (código: %(codigo)s)", mensagem=message, codigo=code)
    return message
