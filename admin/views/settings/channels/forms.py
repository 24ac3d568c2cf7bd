"""The channel form: the fields each provider declares (gateway.contract.CredentialField), and their checks.

The form class carries one `cred_<key>` field per key any provider declares; the page shows, and the
server reads and validates, only the chosen provider's. Secret values are never put back in the page
(a blank secret on edit keeps the stored one); the other values are, so an edit shows what is set.
An edit that points the channel at another server (a base URL to another scheme, host or port, an SMTP
host, port or security: `gateway.egress.secrets_follow`, the rule agents' LLM keys follow too) keeps
none of the stored secrets: the required ones must be typed again, the others are dropped (a
generated one gets a fresh value), so that no editor can have Lembra send them to a server of their own.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from wtforms import BooleanField, PasswordField, SelectField, StringField
from wtforms.validators import DataRequired, Length, Optional

from admin.i18n import _, _l, translate
from admin.views.base import KIND_LABELS, select_choices
from admin.views.settings.channels.messages import PROVIDER_LABELS, egress_error
from engine.words.catalogue import describe
from engine.tenants.channels import new_webhook_secret
from engine.store.models import CHANNEL_KINDS, PROVIDERS
from gateway import registry
from gateway.contract import CredentialField
from gateway.egress import EgressPolicy, InvalidAddress, secrets_follow
from gateway.errors import EgressRefused

CHANNEL_STATUSES = [("active", _l("Ativo")), ("disabled", _l("Desativado"))]
PREFIX = "cred_"
#: The sandbox's receipts (delivered, then read) come this many seconds after a send at most, on the form.
MAX_RECEIPTS_SECONDS = 600
#: Settings (not credentials: stored in the clear in `channels.settings`) each provider's form shows.
PROVIDER_SETTINGS: dict[str, tuple[str, ...]] = {"sandbox": ("receipts_seconds",)}


def provider_fields(provider: str | None) -> tuple[CredentialField, ...]:
    """The credential fields `provider` declares (none for an unknown name)."""
    try:
        return registry.load(provider or "").credential_fields
    except registry.UnknownProvider:
        return ()


def provider_kinds(provider: str | None) -> tuple[str, ...]:
    """The channel kinds `provider` sends."""
    try:
        return registry.load(provider or "").kinds
    except registry.UnknownProvider:
        return ()


def _declared() -> dict[str, bool]:
    """Every key any provider declares → whether it is secret for any of them."""
    keys: dict[str, bool] = {}
    for name in PROVIDERS:
        for field in provider_fields(name):
            keys[field.key] = keys.get(field.key, False) or field.secret
    return keys


def form_attributes() -> dict[str, Any]:
    """The channel form's fields: name, kind, provider, status, default flag, and every credential key."""
    attrs: dict[str, Any] = {
        "name": StringField(_l("Nome"), validators=[DataRequired(message=_l("Dê um nome ao canal.")),
                                                    Length(max=200)]),
        "provider": SelectField(_l("Provedor"),
                                choices=select_choices((p, PROVIDER_LABELS.get(p, p)) for p in PROVIDERS)),
        "kind": SelectField(_l("Tipo"), choices=select_choices((k, KIND_LABELS[k]) for k in CHANNEL_KINDS)),
        "status": SelectField(_l("Status"), choices=select_choices(CHANNEL_STATUSES), default="active"),
        "is_default": BooleanField(_l("Canal padrão deste tipo"), default=True),
    }
    for key, secret in sorted(_declared().items()):
        field_class = PasswordField if secret else StringField
        attrs[PREFIX + key] = field_class(key, validators=[Optional(), Length(max=2000)])
    attrs["receipts_seconds"] = StringField(
        _l("Confirmações de entrega e leitura (segundos)"),
        description=_l("O sandbox marca cada mensagem como entregue este número de segundos depois do envio, e "
                       "como lida o dobro depois, como o celular do paciente faria. 0 ou em branco: sem "
                       "confirmações."),
        validators=[Optional(), Length(max=10)])
    return attrs


def check_settings(form: Any, provider: str) -> bool:
    """Validate the provider's form settings: `receipts_seconds` a whole number of 0 to 600."""
    field = getattr(form, "receipts_seconds", None)
    if field is None or "receipts_seconds" not in PROVIDER_SETTINGS.get(provider, ()):
        return True
    raw = str(field.data or "").strip()
    if raw and not (raw.isdigit() and int(raw) <= MAX_RECEIPTS_SECONDS):
        field.errors = [*field.errors, _("Informe um número inteiro de 0 a %(max)s segundos.",
                                         max=MAX_RECEIPTS_SECONDS)]
        return False
    return True


def settings_of(form: Any, provider: str, stored: Mapping[str, Any]) -> dict[str, Any]:
    """The channel's settings with the provider's form settings over them (a blank one is unset)."""
    merged = dict(stored)
    for key in PROVIDER_SETTINGS.get(provider, ()):
        field = getattr(form, key, None)
        if field is None:
            continue
        raw = str(field.data or "").strip()
        if raw:
            merged[key] = int(raw)  # check_settings let only a whole number of seconds through
        else:
            merged.pop(key, None)
    return merged


def show_settings(form: Any, provider: str, stored: Mapping[str, Any]) -> None:
    """Put the stored settings the provider's form shows in the form (an edit shows what is set)."""
    for key in PROVIDER_SETTINGS.get(provider, ()):
        field = getattr(form, key, None)
        if field is not None and not field.data and isinstance(stored.get(key), (int, float)):
            field.data = str(int(stored[key]))


def keep_only(form: Any, provider: str) -> None:
    """Drop the credential fields `provider` does not declare: they are neither shown nor read."""
    wanted = {PREFIX + f.key for f in provider_fields(provider)}
    for name in [n for n in form._fields if n.startswith(PREFIX) and n not in wanted]:
        delattr(form, name)
    for key in {key for keys in PROVIDER_SETTINGS.values() for key in keys} - set(PROVIDER_SETTINGS.get(provider, ())):
        if key in form._fields:
            delattr(form, key)


def show_stored(form: Any, provider: str, stored: Mapping[str, Any]) -> None:
    """Put the stored non-secret values in the form (an edit shows what is set; secrets never)."""
    for spec in provider_fields(provider):
        field = getattr(form, PREFIX + spec.key, None)
        if field is not None and not spec.secret and not field.data and stored.get(spec.key) is not None:
            field.data = str(stored[spec.key])


def _value(form: Any, key: str) -> str:
    field = getattr(form, PREFIX + key, None)
    return str(field.data or "").strip() if field is not None else ""


def _fail(form: Any, key: str, message: str) -> None:
    field = getattr(form, PREFIX + key)
    field.errors = [*field.errors, message]


def moves_secrets(form: Any, provider: str, stored: Mapping[str, Any]) -> bool:
    """Whether this edit points the channel's stored secrets at another server (see the module)."""
    if not stored:
        return False  # a new channel: nothing stored goes anywhere
    binding = [spec.key for spec in provider_fields(provider) if spec.binds_secrets]
    # A blank field keeps the stored value (`credentials`), so it is not a move.
    return not secrets_follow({key: stored.get(key) for key in binding},
                              {key: _value(form, key) or stored.get(key) for key in binding})


def check_credentials(form: Any, provider: str, stored: Mapping[str, Any], egress: EgressPolicy) -> bool:
    """Validate the chosen provider's fields only: required, format, choices, and the egress guard for
    addresses (a base_url or host inside the network is a form error; the guard refuses it again at
    every connection, which is the check that holds). `stored` is what an edited channel already has;
    an edit that moves its secrets to another server needs the required ones typed again."""
    ok = True
    moved = moves_secrets(form, provider, stored)
    for spec in provider_fields(provider):
        if getattr(form, PREFIX + spec.key, None) is None:
            continue
        value = _value(form, spec.key)
        if not value:
            dropped = moved and spec.secret and bool(stored.get(spec.key))
            has = (bool(stored.get(spec.key)) and not dropped) or spec.generated
            excused = spec.unless is not None and (_value(form, spec.unless) or stored.get(spec.unless))
            if spec.required and not has and not excused:
                _fail(form, spec.key, translate(describe("credential_retype_new_endpoint")) if dropped
                      else _("Preencha este campo."))
                ok = False
            continue
        if spec.address is not None:
            # The guard first: an internal address is said to be one, whatever its spelling; and a URL
            # is checked as the HTTP client will read it.
            try:
                (egress.check_url if spec.address == "url" else egress.check_host)(value)
            except InvalidAddress as exc:
                _fail(form, spec.key, translate(describe(exc.code)))
                ok = False
                continue
            except EgressRefused as exc:
                _fail(form, spec.key, egress_error(exc))
                ok = False
                continue
        if len(value) > spec.max_length:
            _fail(form, spec.key, _("Texto longo demais (máximo de %(max)s caracteres).", max=spec.max_length))
            ok = False
        elif spec.choices and value not in spec.choices:
            _fail(form, spec.key, _("Escolha um destes valores: %(valores)s.", valores=", ".join(spec.choices)))
            ok = False
        elif spec.pattern and not re.fullmatch(spec.pattern, value, re.IGNORECASE if spec.address else 0):
            _fail(form, spec.key, _("Formato inválido. Exemplo: %(exemplo)s", exemplo=spec.example)
                  if spec.example else _("Formato inválido. Confira o valor no painel do provedor."))
            ok = False
    return ok


def updated_credentials(form: Any, provider: str, stored: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """What an edit stores: the stored credentials with the typed values over them, except that an
    edit that moves the secrets to another server keeps none of the stored ones it was not given
    again (a generated one gets a fresh value). Also the keys of the stored secrets it dropped."""
    typed = credentials(form, provider, generate=False)
    merged = dict(stored)
    dropped: list[str] = []
    if moves_secrets(form, provider, stored):
        for spec in provider_fields(provider):
            if spec.secret and spec.key not in typed and merged.get(spec.key):
                dropped.append(spec.key)
                merged.pop(spec.key)
                if spec.generated:
                    merged[spec.key] = new_webhook_secret()
    merged.update(typed)
    return merged, dropped


def credentials(form: Any, provider: str, *, generate: bool) -> dict[str, str]:
    """The chosen provider's values typed in the form (blank ones left out); with `generate`, the
    generated fields left blank get a fresh value (on create only: an edit keeps the stored one)."""
    values: dict[str, str] = {}
    for spec in provider_fields(provider):
        value = _value(form, spec.key)
        if value:
            values[spec.key] = value
        elif generate and spec.generated:
            values[spec.key] = new_webhook_secret()
    return values
