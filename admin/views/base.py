"""The one tenant-scoped base of every console view.

Flask-Admin does not scope anything by itself: its `get_one` (edit, details, delete), its
relationship dropdowns, AJAX loaders and inline models all bypass `get_query`, and its default
form has no CSRF. `TenantModelView` closes each of those for every view that inherits it:

- `get_query` / `get_count_query` / `get_one` filter on the signed-in user's org; another org's
  id answers 404;
- `org_id` (and the timestamps) are set on the server, never taken from a form;
- relationship dropdowns are built by the views from org-scoped queries, `form_ajax_refs`,
  inline models and list editing are refused at start-up;
- forms are `SecureForm`s whose token is Flask-WTF's (the app's CSRFProtect checks every POST);
- owner/manager edit, agent reads;
- CSV export escapes formula cells, and secret columns are never listed, exported or in forms;
- every change writes an `audit_log` row without secrets.
"""

from __future__ import annotations

import csv
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, Mapping
from zoneinfo import ZoneInfo

from flask import (
    Response,
    abort,
    current_app,
    flash,
    g,
    has_request_context,
    redirect,
    request,
    stream_with_context,
    url_for,
)
from flask_admin import BaseView, expose
from flask_admin.contrib.sqla import ModelView
from flask_admin.form import SecureForm
from flask_babel.speaklater import LazyString
from flask_login import current_user
from flask_wtf.csrf import _FlaskFormCSRF
from markupsafe import Markup, escape
from sqlalchemy import func, insert
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Connection
from werkzeug.utils import secure_filename
from wtforms.fields.choices import SelectChoice

from admin import i18n
from admin.i18n import _, _l, current_locale
from admin.ids import MAX_ID, parse_id
from engine.core import clock
from engine.store.models import Org, audit_log
from engine.tenants.audit import redact
from engine.store.runtime import Runtime

#: Columns that hold secrets (sealed credentials, hashes): never listed, in forms or exported.
SECRET_COLUMNS = frozenset({"credentials", "key_version", "password_hash", "key_hash", "llm_api_key",
                            "transcription_api_key"})
#: A CSV cell starting with one of these is a formula in a spreadsheet (CWE-1236).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")

# Labels are lazy (`_l`): they are built once at import and shown in the reader's language on each
# request; `str()` of one (CSV export, filter options) gives the current request's language.
STATUS_LABELS = {
    "new": _l("Planejando"), "pending": _l("Agendada"), "claimed": _l("Na fila"), "sending": _l("Enviando"),
    "sent": _l("Enviada"), "delivered": _l("Entregue"), "read": _l("Lida"), "failed": _l("Falhou"),
    "unknown": _l("Incerta"), "cancelled": _l("Cancelada"), "expired": _l("Expirada"), "dead": _l("Esgotada"),
    "skipped": _l("Não enviada"),
    # appointments
    "scheduled": _l("Agendado"), "confirmed": _l("Confirmado"), "completed": _l("Realizado"), "no_show": _l("Faltou"),
    # channels
    "active": _l("Ativo"), "disabled": _l("Desativado"), "error": _l("Com erro"),
    # a send or the provider said the channel stopped working (number disconnected, key refused)
    "broken": _l("Com falha"),
}
STATUS_COLORS = {
    "sent": "success", "delivered": "success", "read": "success", "confirmed": "success", "active": "success",
    "completed": "success",
    "failed": "danger", "dead": "danger", "unknown": "danger", "error": "danger", "no_show": "danger", "broken": "danger",
    "cancelled": "secondary", "expired": "secondary", "skipped": "secondary", "disabled": "secondary",
    "pending": "warning", "new": "warning", "claimed": "warning", "sending": "warning", "scheduled": "info",
}
KIND_LABELS = {"whatsapp": "WhatsApp", "email": _l("E-mail"), "sms": "SMS"}
PURPOSE_LABELS = {
    "session_reminder": _l("Lembrete de sessão"), "session_confirmation": _l("Confirmação de agendamento"),
    "session_cancellation": _l("Aviso de cancelamento"), "confirm_ack": _l("Resposta: confirmado"),
    "cancel_ack": _l("Resposta: cancelado"), "optout_confirmation": _l("Confirmação de descadastro"),
    "followup": _l("Follow-up"), "adhoc": _l("Avulsa"),
    "conversation_reply": _l("Resposta da clínica"),
    "clinic_phone": _l("Enviada pelo celular da clínica"),  # engine/messaging/clinic_phone.py  # written in Conversas (admin/views/desk/conversations.py)
    "conversation_reopen": _l("Retomar a conversa (modelo aprovado)"),
    "followup_checkin": _l("Follow-up: ficou alguma dúvida?"), "followup_rebook": _l("Follow-up: remarcar a falta"),
    "followup_reply_ack": _l("Follow-up: resposta recebida"),
}
#: A template's language, as the Modelos page names it.
LOCALE_LABELS = {"pt_BR": _l("Português (Brasil)"), "en": _l("Inglês"), "es": _l("Espanhol")}


def select_choices(pairs: Iterable[tuple[Any, Any]]) -> list[SelectChoice]:
    """(value, label) pairs as a select field's options: WTForms 3.3 deprecates tuples (3.4 drops them)."""
    return [SelectChoice(value, label) for value, label in pairs]


def runtime() -> Runtime:
    return current_app.config["LEMBRA_RUNTIME"]


def db_session() -> Any:
    """The console's scoped ORM session (one per app, bound to the runtime's engine)."""
    return current_app.extensions["lembra_session"]()


def org_id() -> int:
    """The signed-in user's org (is_accessible has run before any view code)."""
    return int(current_user.org_id)


def is_editor() -> bool:
    return bool(current_user.is_authenticated and current_user.role in ("owner", "manager"))


class TenantSecureForm(SecureForm):
    """Flask-Admin's SecureForm with Flask-WTF's token, the one the app's CSRFProtect checks."""

    class Meta(SecureForm.Meta):
        csrf_class = _FlaskFormCSRF
        csrf_field_name = "csrf_token"

        @property
        def csrf_secret(self) -> Any:
            return current_app.config.get("WTF_CSRF_SECRET_KEY", current_app.secret_key)

        @property
        def csrf_time_limit(self) -> Any:
            return current_app.config.get("WTF_CSRF_TIME_LIMIT", 3600)

    def validate(self, extra_validators: Any = None) -> bool:
        ok = super().validate(extra_validators)
        # Validator messages are lazy strings (`_l`, fixed when the view class is built); Flask-Admin's
        # field template shows an error only when it `is string`, so resolve them in the reader's language.
        for field in self:
            field.errors = [str(e) if isinstance(e, LazyString) else e for e in field.errors]
        return ok


def csv_safe(value: Any) -> Any:
    """A CSV cell that a spreadsheet will not evaluate as a formula."""
    if value is None:
        return ""
    if isinstance(value, Markup):
        value = str(value.striptags())
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def org_name() -> str:
    """The signed-in user's clinic's name (a template's preview greets as the clinic does)."""
    name = g.get("lembra_org_name")
    if name is None:
        org = db_session().get(Org, org_id())
        name = g.lembra_org_name = org.name if org is not None else ""
    return name


def org_timezone() -> str:
    tz = g.get("lembra_org_tz")
    if tz is None:
        org = db_session().get(Org, org_id())
        tz = g.lembra_org_tz = org.timezone if org is not None else "America/Sao_Paulo"
    return tz


#: Date-time formats per console language (English gets ISO order: unambiguous for every reader).
DATETIME_FORMATS = {"pt_BR": "%d/%m/%Y %H:%M", "en": "%Y-%m-%d %H:%M"}


def local_dt(value: datetime | None, fmt: str | None = None, *, seconds: bool = False) -> str:
    """`value` in the org's time zone, in the reader's date format unless `fmt` is given."""
    if value is None:
        return "—"
    if fmt is None:
        fmt = DATETIME_FORMATS.get(current_locale(), DATETIME_FORMATS["pt_BR"]) + (":%S" if seconds else "")
    return value.astimezone(ZoneInfo(org_timezone())).strftime(fmt)


i18n.format_instant = local_dt


def badge(status: str | None, labels: Mapping[str, Any] | None = None) -> Markup:
    """A status as a coloured badge. `labels` overrides the words where one column needs its own
    grammatical gender (an appointment is "Cancelado" beside "Agendado"; a message "Cancelada")."""
    if not status:
        return Markup("—")
    color = STATUS_COLORS.get(status, "light")
    label = (labels or {}).get(status) or STATUS_LABELS.get(status, status)
    return Markup('<span class="badge badge-{}">{}</span>').format(color, label)


def _fmt_datetime(view: Any, value: datetime, name: str | None = None) -> str:
    return local_dt(value)


def _fmt_bool(view: Any, value: bool, name: str | None = None) -> str:
    return _("Sim") if value else _("Não")


def write_audit(conn: Connection, action: str, entity: str, entity_id: int | None,
                changes: Mapping[str, Any] | None = None) -> None:
    """One audit row for a console change; secret keys never reach it, personal data is redacted
    as the API's rows are (engine.tenants.audit.redact)."""
    clean = redact({k: _jsonable(v) for k, v in (changes or {}).items() if k not in SECRET_COLUMNS}, entity)
    conn.execute(insert(audit_log).values(
        org_id=org_id(), user_id=int(current_user.id), action=action, entity=entity,
        entity_id=entity_id, changes=clean or None, created_at=clock.now(),
    ))


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def changed_fields(model: Any) -> dict[str, Any]:
    """The model's attributes changed in this unit of work, new values, secrets left out."""
    state = sa_inspect(model)
    out: dict[str, Any] = {}
    for attr in state.attrs:
        if attr.key in SECRET_COLUMNS or attr.key in ("created_at", "updated_at"):
            continue
        history = attr.history
        if history.has_changes():
            out[attr.key] = history.added[0] if history.added else None
    return out


class CountedLabel:
    """A menu label with a number, "Pendências (3)", counted at each render for the signed-in
    user's org (Flask-Admin builds the menu once at start-up, for everyone)."""

    def __init__(self, label: Any, count: Callable[[], int]) -> None:
        self.label = label
        self.count = count

    def __str__(self) -> str:
        label = str(self.label)
        if not has_request_context() or not current_user.is_authenticated:
            return label
        count = self.count()
        return f"{label} ({count})" if count else label

    def __html__(self) -> str:
        return str(escape(str(self)))


class CountedMenu:
    """A view whose menu item shows `menu_count()`: Flask-Admin sets `view.menu` when it builds the
    menu, and the label is wrapped then."""

    def menu_count(self) -> int:
        raise NotImplementedError

    @property
    def menu(self) -> Any:
        return self._menu

    @menu.setter
    def menu(self, item: Any) -> None:
        if item is not None and not isinstance(item.name, CountedLabel):
            item.name = CountedLabel(item.name, self.menu_count)
        self._menu = item


class SignedInOrgAccess:
    """Access shared by every console view: a signed-in user of any role, bound to their org for
    the request (`g.lembra_org_id`, which row-level security on PostgreSQL reads too); anyone else
    goes to the login page and comes back after it."""

    def is_accessible(self) -> bool:
        if not current_user.is_authenticated:
            return False
        g.lembra_org_id = int(current_user.org_id)
        return True

    def inaccessible_callback(self, name: str, **kwargs: Any) -> Any:
        return redirect(url_for("auth.login", next=request.full_path if request.method == "GET" else None))


class TenantPageView(SignedInOrgAccess, BaseView):
    """A console page that is not a table of one model (sandbox chat, runs, flows, builder); the
    page says itself who may change what."""


class TenantModelView(SignedInOrgAccess, ModelView):
    """Every console view inherits this; see the module docstring for what it guarantees."""

    form_base_class = TenantSecureForm
    can_export = True
    export_types = ["csv", "excel"]
    can_view_details = True
    can_set_page_size = False
    page_size = 50
    column_display_pk = False
    form_ajax_refs: Any = None
    inline_models: Any = None
    column_editable_list: Any = ()
    list_template = "admin/lembra_list.html"
    details_template = "admin/lembra_details.html"
    column_type_formatters = {datetime: _fmt_datetime, bool: _fmt_bool, type(None): lambda v, x, n=None: "—"}
    column_type_formatters_detail = column_type_formatters
    column_type_formatters_export = {datetime: _fmt_datetime, bool: _fmt_bool, type(None): lambda v, x, n=None: ""}

    #: Switches of the view itself; the user's role narrows them per request (agents read only).
    allow_create = True
    allow_edit = True
    allow_delete = False
    #: Table name written in audit_log.entity.
    audit_entity = ""
    #: What to say when the list is empty (tells the user what to do next).
    empty_message = _l("Nada por aqui ainda.")

    def __init__(self, model: Any, session: Any, **kwargs: Any) -> None:
        super().__init__(model, session, **kwargs)
        if self.form_ajax_refs or self.inline_models or self.column_editable_list:
            raise RuntimeError("AJAX refs, inline models and list editing bypass the tenant scope")
        for attr in ("column_list", "column_details_list", "column_export_list", "form_columns",
                     "column_searchable_list", "column_filters", "column_sortable_list"):
            names = {c if isinstance(c, str) else getattr(c, "key", getattr(c, "name", "")) for c in (getattr(self, attr) or ())}
            leaked = names & SECRET_COLUMNS
            if leaked:
                raise RuntimeError(f"{type(self).__name__}.{attr} exposes {sorted(leaked)}")
        self.audit_entity = self.audit_entity or model.__tablename__

    # --- role -------------------------------------------------------------------------------
    @property
    def can_create(self) -> bool:  # type: ignore[override]
        return self.allow_create and is_editor()

    @property
    def can_edit(self) -> bool:  # type: ignore[override]
        return self.allow_edit and is_editor()

    @property
    def can_delete(self) -> bool:  # type: ignore[override]
        return self.allow_delete and is_editor()

    def is_action_allowed(self, name: str) -> bool:
        return is_editor() and super().is_action_allowed(name)

    # --- scoping ------------------------------------------------------------------------------
    def scope(self, query: Any) -> Any:
        return query.filter(self.model.org_id == org_id())

    def get_query(self) -> Any:
        return self.scope(self.session.query(self.model))

    def get_count_query(self) -> Any:
        return self.scope(self.session.query(func.count("*")).select_from(self.model))

    def get_one(self, id: Any) -> Any:
        # Beyond bigint, zero, negative or not a number: no row has it, and the database must not
        # be asked (SQLite cannot bind it, PostgreSQL says "bigint out of range").
        pk = parse_id(id if isinstance(id, int) else str(id))
        if pk is None:
            abort(404)
        row = self.get_query().filter(self.model.id == pk).one_or_none()
        if row is None:
            abort(404)
        return row

    def _get_list_filter_args(self) -> Any:
        """Flask-Admin's, with every value checked by its (typed) filter: one it cannot take (text
        for an id, a NUL, a date that is none) is left out and the list says so, never a 500."""
        if not self._filters:
            return None
        chosen = []
        for arg in request.args:
            if not arg.startswith("flt") or "_" not in arg:
                continue
            pos, key = arg[3:].split("_", 1)
            if key not in (self._filter_args or {}):
                continue
            idx, flt = self._filter_args[key]
            value = request.args[arg]
            if "\x00" not in value and flt.validate(value):
                chosen.append((pos, (idx, str(flt.name), value)))
            else:
                flash(self.get_invalid_value_msg(value, flt), "error")
        return [item for _pos, item in sorted(chosen, key=lambda n: n[0])]

    def get_invalid_value_msg(self, value: str, filter: Any) -> str:
        shown = value.replace("\x00", "")
        shown = shown if len(shown) <= 40 else shown[:40] + "…"
        return _("Filtro ignorado: “%(valor)s” não é um valor válido para “%(filtro)s”.",
                 valor=shown, filtro=str(filter.name))

    def _get_list_extra_args(self) -> Any:
        """Page and search as the database can take them: a negative page is the first, a page past
        any offset a bigint holds is the last one that fits, and a NUL (which no text column can
        hold on PostgreSQL) is dropped from the search."""
        args = super()._get_list_extra_args()
        size = self.page_size or 1
        args.page = min(max(args.page or 0, 0), MAX_ID // size - 1)
        if args.search:
            args.search = args.search.replace("\x00", "") or None
        return args

    def _get_filter_groups(self) -> Any:
        """Filter options that depend on the org (a callable) are built per request, not once
        at start-up for everyone."""
        groups = super()._get_filter_groups()
        for items in (groups or {}).values():
            for i, item in enumerate(items):
                flt = self._filters[item["index"]]
                if callable(flt.options):
                    items[i] = {**item, "options": [(str(k), str(v)) for k, v in flt.options()]}
        return groups

    def ajax_lookup(self) -> Any:  # no AJAX loaders: they would bypass the org filter
        abort(404)

    # --- writes -------------------------------------------------------------------------------
    def on_model_change(self, form: Any, model: Any, is_created: bool) -> None:
        now = clock.now()
        model.org_id = org_id()  # never from the form
        if is_created and hasattr(model, "created_at"):
            model.created_at = now
        if hasattr(model, "updated_at"):
            model.updated_at = now
        changes = changed_fields(model)
        changes.pop("org_id", None)
        self.session.flush()  # the new row's id, in the same transaction as its audit row
        write_audit(self.session.connection(), "create" if is_created else "update", self.audit_entity,
                    model.id, changes)

    def on_model_delete(self, model: Any) -> None:
        write_audit(self.session.connection(), "delete", self.audit_entity, model.id, None)

    def handle_view_exception(self, exc: Exception) -> bool:
        from engine.core.errors import DomainError

        if isinstance(exc, DomainError):
            flash(_("Não foi possível salvar: %(erro)s", erro=exc), "error")
            return True
        return super().handle_view_exception(exc)

    # --- export ---------------------------------------------------------------------------------
    def get_export_value(self, model: Any, name: Any) -> Any:
        return csv_safe(super().get_export_value(model, name))

    def get_export_name(self, export_type: str = "csv") -> str:
        extension = "csv" if export_type == "excel" else export_type
        return f"lembra-{self.endpoint}-{clock.now().strftime('%Y%m%d-%H%M')}.{extension}"

    @expose("/export/<export_type>/")
    def export(self, export_type: str) -> Any:
        """CSV as is, or "excel": the same rows for Excel set to Portuguese (Brazil), which
        splits on `;` and reads a file as UTF-8 only when it starts with a BOM."""
        if export_type != "excel" or not self.can_export:
            return super().export(export_type)
        _, data = self._export_data()
        columns = self._export_columns

        class _Line:
            def write(self, value: str) -> str:
                return value

        writer = csv.writer(_Line(), delimiter=";")

        def rows() -> Iterator[str]:
            yield "\ufeff" + writer.writerow([str(title) for _, title in columns])
            for model in data:
                yield writer.writerow(["" if value is None else str(value)
                                       for value in (self.get_export_value(model, name) for name, _ in columns)])

        filename = secure_filename(self.get_export_name("excel"))
        return Response(stream_with_context(rows()), mimetype="text/csv; charset=utf-8",
                        headers={"Content-Disposition": f"attachment;filename={filename}"})

    def render(self, template: str, **kwargs: Any) -> Any:
        kwargs.setdefault("empty_message", self.empty_message)
        kwargs.setdefault("filtered_empty_message", _("Nada encontrado com estes filtros ou esta busca. Limpe os "
                                                      "filtros para ver tudo."))
        _replace_generic_save_flash()
        return super().render(template, **kwargs)


def _replace_generic_save_flash() -> None:
    """Flask-Admin says only "Failed to create record." when a form does not validate; say what
    to do instead (the fields' own errors are shown beside them). And a save says one thing: when
    the view said what the save did ("Agendamento criado; 2 lembretes na fila"), Flask-Admin's own
    "Registro salvo com sucesso" beside it is dropped."""
    from flask import session
    from flask_admin.babel import gettext as admin_gettext

    flashes = session.get("_flashes")
    if not flashes:
        return
    saved = {admin_gettext("Record was successfully created."), admin_gettext("Record was successfully saved."),
             "Record was successfully created.", "Record was successfully saved."}
    if len(flashes) > 1 and any(message in saved for _, message in flashes) and \
            any(message not in saved for _, message in flashes):
        flashes = session["_flashes"] = [(c, m) for c, m in flashes if m not in saved]
    generic = {admin_gettext("Failed to create record."), admin_gettext("Failed to save record."),
               "Failed to create record.", "Failed to save record."}
    if any(message in generic for _, message in flashes):
        session["_flashes"] = [(category, _("Não foi salvo: corrija os campos marcados em vermelho e salve de novo."))
                               if message in generic else (category, message) for category, message in flashes]


def ids_of(raw: Iterable[str]) -> list[int]:
    """Row ids posted by a list action, as ints (anything that cannot be an id is dropped)."""
    return [pk for pk in (parse_id(str(x)) for x in raw) if pk is not None]
