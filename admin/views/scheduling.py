"""Agendamentos, Contatos and Regras de lembrete."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from flask import abort, flash, redirect, request, url_for
from flask_admin import expose
from flask_admin.actions import action
from flask_admin.contrib.sqla.filters import DateTimeBetweenFilter, FilterEqual
from markupsafe import Markup
from sqlalchemy import delete, insert, update
from werkzeug.datastructures import CombinedMultiDict
from wtforms import (
    BooleanField,
    FileField,
    IntegerField,
    SelectField,
    SelectMultipleField,
    StringField,
)
from wtforms.fields import DateTimeLocalField
from wtforms.validators import (
    DataRequired,
    Email,
    Length,
    NumberRange,
    Optional,
    ValidationError,
)

from admin.views.base import (
    KIND_LABELS,
    PURPOSE_LABELS,
    TenantModelView,
    TenantSecureForm,
    badge,
    ids_of,
    is_editor,
    local_dt,
    org_id,
    org_timezone,
    runtime,
    write_audit,
)
from engine import appointments as appts
from engine import clock
from engine import imports as csv_import
from engine.contacts import create_contact
from engine.models import (
    APPOINTMENT_STATUSES,
    CHANNEL_KINDS,
    Appointment,
    Contact,
    Preference,
    ReminderRuleKind,
    appointments,
    contacts,
    reminder_rule_kinds,
)
from engine.orgs import DomainError
from engine.populate import refresh_appointment
from gateway.phones import InvalidPhone, normalize_phone

STATUS_CHOICES = [("scheduled", "Agendado"), ("confirmed", "Confirmado"), ("cancelled", "Cancelado"),
                  ("completed", "Realizado"), ("no_show", "Faltou")]
MODE_CHOICES = [("", "—"), ("in_person", "Presencial"), ("online", "Online")]


def _contact_name(session: Any, contact_id: int | None) -> str:
    if contact_id is None:
        return "—"
    row = session.query(Contact).filter(Contact.org_id == org_id(), Contact.id == contact_id).one_or_none()
    return (row.name or f"Contato {row.id}") if row else "—"


class ImportForm(TenantSecureForm):
    """The CSV upload (the token is checked by the app's CSRFProtect and by the form)."""

    file = FileField("Arquivo CSV")


#: Errors listed on the result page; the counts always cover all of them.
IMPORT_ERRORS_SHOWN = 1000
IMPORT_COLUMNS = [
    ("external_id", "sim", "ID do agendamento no seu sistema (atualiza se já existir)"),
    ("contact_external_id", "sim", "ID do paciente no seu sistema"),
    ("contact_name", "sim", "Nome do paciente"),
    ("phone", "não", "Celular com DDD, ex.: (16) 99988-7766"),
    ("email", "não", "E-mail do paciente"),
    ("starts_at", "sim", "dd/mm/aaaa hh:mm (horário da clínica) ou ISO 8601 com fuso, ex.: 2026-12-03T14:30-03:00"),
    ("professional", "não", "Profissional"),
    ("mode", "não", "presencial ou online"),
    ("location", "não", "Local / sala"),
    ("status", "não", "agendado, confirmado, cancelado, realizado ou faltou"),
    ("consent", "não", "Canais que o paciente aceitou, separados por |, ex.: whatsapp|email"),
]


# ------------------------------------------------------------------------------------------------
class AppointmentView(TenantModelView):
    """Appointments, written through engine.appointments; every change re-populates at once."""

    column_list = ("starts_at", "contact_id", "professional", "mode", "location", "status", "external_id")
    column_details_list = column_list + ("timezone", "confirmed_at", "cancelled_at", "cancel_source", "created_at", "updated_at")
    column_export_list = column_list
    column_labels = {
        "starts_at": "Início", "contact_id": "Paciente", "professional": "Profissional", "mode": "Modalidade",
        "location": "Local", "status": "Status", "external_id": "ID externo", "timezone": "Fuso horário",
        "confirmed_at": "Confirmado em", "cancelled_at": "Cancelado em", "cancel_source": "Cancelado por",
        "created_at": "Criado em", "updated_at": "Atualizado em",
    }
    column_sortable_list = ("starts_at", "status", "professional")
    column_default_sort = ("starts_at", True)
    column_searchable_list = ("professional", "external_id", "location")
    column_filters = (FilterEqual(Appointment.status, "Status", options=[(k, v) for k, v in STATUS_CHOICES]),
                      DateTimeBetweenFilter(Appointment.starts_at, "Início"), "professional")
    column_choices = {"status": [(s, s) for s in APPOINTMENT_STATUSES]}
    empty_message = ("Nenhum agendamento. Crie um aqui, importe uma planilha CSV ou envie pela API; os lembretes "
                     "entram na fila na hora.")
    audit_entity = "appointments"
    list_template = "admin/appointment_list.html"

    # --- CSV import ---------------------------------------------------------------------------
    def create_blueprint(self, admin: Any) -> Any:
        blueprint = super().create_blueprint(admin)
        endpoint = f"{self.endpoint}.import_csv"

        def allow_upload() -> None:
            # The app refuses bodies over 1 MB before any view runs (and CSRFProtect reads the form
            # first), so the import page raises its own limit for its own POSTs only.
            if request.endpoint == endpoint and request.method == "POST":
                request.max_content_length = csv_import.MAX_BYTES + 256 * 1024

        @blueprint.record_once
        def _register(state: Any) -> None:
            state.app.before_request_funcs.setdefault(None, []).insert(0, allow_upload)

        @blueprint.errorhandler(413)
        def _too_large(exc: Any) -> Any:
            flash(f"Arquivo grande demais: o limite é {csv_import.MAX_BYTES // (1024 * 1024)} MB. "
                  "Divida-o em partes.", "error")
            return redirect(url_for(endpoint))

        return blueprint

    @expose("/import/", methods=("GET", "POST"))
    def import_csv(self) -> Any:
        if not is_editor():
            abort(403)
        form = ImportForm(CombinedMultiDict((request.files, request.form)) if request.method == "POST" else None)
        report = None
        if request.method == "POST" and form.validate():
            upload = form.file.data
            if upload is None or not getattr(upload, "filename", ""):
                form.file.errors = ["Escolha um arquivo CSV."]
            else:
                try:
                    report = csv_import.import_appointments(runtime().db, org_id(), upload.stream)
                except csv_import.ImportFileError as exc:
                    flash(str(exc), "error")
                else:
                    with runtime().db.begin() as conn:
                        write_audit(conn, "import", "appointments", None, report.counts())
                    flash(f"Importação concluída: {report.created} agendamento(s) criado(s), {report.updated} "
                          f"atualizado(s), {report.unchanged} sem alteração, {len(report.errors)} linha(s) com "
                          f"erro; {report.reminders_created} lembrete(s) na fila.",
                          "warning" if report.errors else "success")
        return self.render("admin/appointment_import.html", form=form, report=report, columns=IMPORT_COLUMNS,
                           example_header=csv_import.EXAMPLE_HEADER, example_line=csv_import.EXAMPLE_LINE,
                           max_mb=csv_import.MAX_BYTES // (1024 * 1024), max_rows=csv_import.MAX_ROWS,
                           errors_shown=IMPORT_ERRORS_SHOWN)

    column_formatters = {
        "contact_id": lambda v, c, m, n: _contact_name(v.session, m.contact_id),
        "status": lambda v, c, m, n: badge(m.status),
        "mode": lambda v, c, m, n: dict(MODE_CHOICES).get(m.mode or "", m.mode),
        "starts_at": lambda v, c, m, n: local_dt(m.starts_at),
    }
    column_formatters_export = {
        "contact_id": lambda v, c, m, n: _contact_name(v.session, m.contact_id),
        "starts_at": lambda v, c, m, n: local_dt(m.starts_at),
    }

    def scaffold_form(self) -> Any:
        class AppointmentForm(self.form_base_class):  # type: ignore[name-defined,misc]
            contact_id = SelectField("Paciente", coerce=int, validators=[DataRequired(message="Escolha o paciente.")])
            starts_at = DateTimeLocalField("Início (horário da clínica)", format="%Y-%m-%dT%H:%M",
                                           validators=[DataRequired(message="Informe data e hora.")])
            professional = StringField("Profissional", validators=[Optional(), Length(max=200)])
            mode = SelectField("Modalidade", choices=MODE_CHOICES, validators=[Optional()])
            location = StringField("Local", validators=[Optional(), Length(max=300)])
            status = SelectField("Status", choices=STATUS_CHOICES, default="scheduled")
            external_id = StringField("ID externo", validators=[Optional(), Length(max=200)])
        return AppointmentForm

    def _scope_choices(self, form: Any) -> Any:
        rows = self.session.query(Contact.id, Contact.name).filter(
            Contact.org_id == org_id(), Contact.erased_at.is_(None)).order_by(Contact.name).all()
        form.contact_id.choices = [(r.id, r.name or f"Contato {r.id}") for r in rows]
        return form

    def create_form(self, obj: Any = None) -> Any:
        return self._scope_choices(super().create_form(obj))

    def edit_form(self, obj: Any = None) -> Any:
        return self._scope_choices(super().edit_form(obj))

    def on_form_prefill(self, form: Any, id: Any) -> None:
        model = self.get_one(id)
        form.starts_at.data = model.starts_at.astimezone(ZoneInfo(org_timezone())).replace(tzinfo=None)

    def _starts_at(self, form: Any) -> datetime:
        return form.starts_at.data.replace(tzinfo=ZoneInfo(org_timezone()))

    def create_model(self, form: Any) -> Any:
        conn = self.session.connection()
        try:
            appointment_id = appts.create_appointment(
                conn, org_id=org_id(), contact_id=form.contact_id.data, starts_at=self._starts_at(form),
                professional=form.professional.data or None, mode=form.mode.data or None,
                location=form.location.data or None, external_id=form.external_id.data or None,
                status=form.status.data or "scheduled",
            )
            result = refresh_appointment(conn, org_id(), appointment_id)
            write_audit(conn, "create", "appointments", appointment_id, {
                "contact_id": form.contact_id.data, "starts_at": self._starts_at(form),
                "professional": form.professional.data, "status": form.status.data,
            })
            self.session.commit()
        except DomainError as exc:
            self.session.rollback()
            flash(f"Não foi possível salvar: {exc}", "error")
            return False
        flash(f"Agendamento criado; {getattr(result, 'created', 0)} lembrete(s) na fila.", "success")
        return self.get_one(appointment_id)

    def update_model(self, form: Any, model: Any) -> bool:
        conn = self.session.connection()
        oid, aid = org_id(), int(model.id)
        before = {k: getattr(model, k) for k in ("contact_id", "starts_at", "professional", "mode", "location",
                                                    "status", "external_id")}
        new_start = self._starts_at(form)
        changes: dict[str, Any] = {}
        try:
            plain = {"contact_id": form.contact_id.data, "professional": form.professional.data or None,
                     "mode": form.mode.data or None, "location": form.location.data or None,
                     "external_id": form.external_id.data or None}
            diff = {k: v for k, v in plain.items() if before[k] != v}
            if diff:
                conn.execute(update(appointments).where(appointments.c.org_id == oid, appointments.c.id == aid)
                             .values(**diff, updated_at=clock.now()))
                changes.update(diff)
            if new_start != before["starts_at"]:
                if appts.reschedule(conn, oid, aid, new_start):
                    changes["starts_at"] = new_start
            status = form.status.data
            if status != before["status"]:
                if status == "cancelled":
                    appts.cancel(conn, oid, aid, source="clinic")
                elif status == "confirmed":
                    appts.confirm(conn, oid, aid)
                else:
                    conn.execute(update(appointments).where(appointments.c.org_id == oid, appointments.c.id == aid)
                                 .values(status=status, updated_at=clock.now()))
                changes["status"] = status
            refresh_appointment(conn, oid, aid)
            write_audit(conn, "update", "appointments", aid, changes)
            self.session.commit()
        except DomainError as exc:
            self.session.rollback()
            flash(f"Não foi possível salvar: {exc}", "error")
            return False
        return True

    @action("cancel", "Cancelar agendamentos", "Cancelar os agendamentos selecionados? Os lembretes pendentes deixam de sair.")
    def action_cancel(self, ids: Any) -> None:
        conn = self.session.connection()
        done = 0
        for aid in ids_of(ids):
            if appts.cancel(conn, org_id(), aid, source="clinic"):
                refresh_appointment(conn, org_id(), aid)
                write_audit(conn, "cancel", "appointments", aid, {"status": "cancelled"})
                done += 1
        self.session.commit()
        flash(f"{done} agendamento(s) cancelado(s).", "success")


# ------------------------------------------------------------------------------------------------
def _consent_badges(view: Any, model: Any) -> Markup:
    rows = view.session.query(Preference).filter(Preference.org_id == org_id(),
                                                 Preference.contact_id == model.id).order_by(Preference.kind).all()
    if not rows:
        return Markup('<span class="text-muted">sem consentimento</span>')
    parts = []
    for p in rows:
        label = KIND_LABELS.get(p.kind, p.kind)
        if p.opted_out_at is not None:
            parts.append(Markup('<span class="badge badge-danger" title="saiu em {}">{}: saiu</span>').format(
                local_dt(p.opted_out_at), label))
        elif p.opted_in:
            parts.append(Markup('<span class="badge badge-success" title="desde {}">{}</span>').format(
                local_dt(p.opted_in_at), label))
    return Markup(" ").join(parts) or Markup('<span class="text-muted">sem consentimento</span>')


def _consent_history(view: Any, model: Any) -> Markup:
    rows = view.session.query(Preference).filter(Preference.org_id == org_id(),
                                                 Preference.contact_id == model.id).order_by(Preference.kind).all()
    items = [Markup("<li>{}: {}{}{}</li>").format(
        KIND_LABELS.get(p.kind, p.kind),
        f"aceitou em {local_dt(p.opted_in_at)}" if p.opted_in_at else "sem aceite",
        f"; saiu em {local_dt(p.opted_out_at)}" if p.opted_out_at else "",
        f" (origem: {p.source})" if p.source else "") for p in rows]
    return Markup("<ul class='mb-0'>{}</ul>").format(Markup("").join(items)) if items else Markup("—")


def _consent_text(view: Any, model: Any) -> str:
    rows = view.session.query(Preference).filter(Preference.org_id == org_id(), Preference.contact_id == model.id).all()
    return ", ".join(f"{p.kind}:{'saiu' if p.opted_out_at else ('sim' if p.opted_in else 'não')}" for p in rows)


class ContactView(TenantModelView):
    """Contacts; consent and opt-out history are shown, never edited here."""

    column_list = ("name", "phone", "email", "external_id", "consent", "created_at")
    column_details_list = ("name", "phone", "email", "external_id", "locale", "consent_history", "created_at", "updated_at")
    column_export_list = ("name", "phone", "email", "external_id", "consent_text", "created_at")
    column_labels = {"name": "Nome", "phone": "Telefone", "email": "E-mail", "external_id": "ID externo",
                     "locale": "Idioma", "consent": "Consentimento", "consent_history": "Consentimento e descadastros",
                     "consent_text": "Consentimento", "created_at": "Criado em", "updated_at": "Atualizado em"}
    column_searchable_list = ("name", "phone", "email", "external_id")
    column_sortable_list = ("name", "created_at")
    column_default_sort = ("name", False)
    column_filters = ("name", DateTimeBetweenFilter(Contact.created_at, "Criado em"))
    column_formatters = {"consent": lambda v, c, m, n: _consent_badges(v, m),
                         "consent_history": lambda v, c, m, n: _consent_history(v, m)}
    column_formatters_detail = column_formatters
    column_formatters_export = {"consent_text": lambda v, c, m, n: _consent_text(v, m)}
    empty_message = "Nenhum contato. Cadastre um paciente aqui ou envie pela API; depois crie um agendamento para ele."

    def get_query(self) -> Any:
        return super().get_query().filter(Contact.erased_at.is_(None))

    def get_count_query(self) -> Any:
        return super().get_count_query().filter(Contact.erased_at.is_(None))

    def scaffold_form(self) -> Any:
        class ContactForm(self.form_base_class):  # type: ignore[name-defined,misc]
            name = StringField("Nome", validators=[DataRequired(message="Informe o nome."), Length(max=200)])
            phone = StringField("Telefone (com DDD)", validators=[Optional(), Length(max=40)])
            email = StringField("E-mail", validators=[Optional(), Email(message="E-mail inválido."), Length(max=200)])
            external_id = StringField("ID externo", validators=[Optional(), Length(max=200)])
            locale = SelectField("Idioma", choices=[("", "Da clínica"), ("pt_BR", "Português"), ("en", "Inglês"),
                                                    ("es", "Espanhol")], validators=[Optional()])
            consent = SelectMultipleField("Consentiu receber por", choices=[(k, KIND_LABELS[k]) for k in CHANNEL_KINDS],
                                          default=list(CHANNEL_KINDS))

            def validate_phone(self, field: Any) -> None:
                if field.data:
                    try:
                        normalize_phone(field.data)
                    except InvalidPhone:
                        raise ValidationError("Telefone inválido.") from None
        return ContactForm

    def edit_form(self, obj: Any = None) -> Any:
        form = super().edit_form(obj)
        del form.consent  # consent changes come from the patient (keywords, opt-out links)
        return form

    def create_model(self, form: Any) -> Any:
        conn = self.session.connection()
        try:
            contact_id = create_contact(
                conn, org_id=org_id(), name=form.name.data.strip(), phone=form.phone.data or None,
                email=form.email.data or None, external_id=form.external_id.data or None,
                locale=form.locale.data or None, consent=form.consent.data or (), consent_source="clinic",
                consent_evidence="console",
            )
            write_audit(conn, "create", "contacts", contact_id, {"consent": form.consent.data})
            self.session.commit()
        except DomainError as exc:
            self.session.rollback()
            flash(f"Não foi possível salvar: {exc}", "error")
            return False
        return self.get_one(contact_id)

    def update_model(self, form: Any, model: Any) -> bool:
        conn = self.session.connection()
        values = {"name": form.name.data.strip(), "phone": normalize_phone(form.phone.data) if form.phone.data else None,
                  "email": form.email.data.strip().lower() if form.email.data else None,
                  "external_id": form.external_id.data or None, "locale": form.locale.data or None}
        diff = {k: v for k, v in values.items() if getattr(model, k) != v}
        if diff:
            conn.execute(update(contacts).where(contacts.c.org_id == org_id(), contacts.c.id == model.id)
                         .values(**diff, updated_at=clock.now()))
            write_audit(conn, "update", "contacts", model.id, {k: "(alterado)" for k in diff})  # no PII in the log
        self.session.commit()
        return True


# ------------------------------------------------------------------------------------------------
TRIGGERS = [("before_start", "Antes do início"), ("after_start", "Depois do início"),
            ("on_create", "Ao agendar"), ("on_cancel", "Ao cancelar")]


def parse_kinds(raw: str) -> list[str]:
    kinds = [k.strip().lower() for k in (raw or "").split(",") if k.strip()]
    bad = [k for k in kinds if k not in CHANNEL_KINDS]
    if bad:
        raise ValidationError(f"Canal desconhecido: {', '.join(bad)}. Use {', '.join(CHANNEL_KINDS)}.")
    if not kinds:
        raise ValidationError("Informe ao menos um canal (ex.: whatsapp, sms).")
    if len(set(kinds)) != len(kinds):
        raise ValidationError("Cada canal só pode aparecer uma vez.")
    return kinds


def _rule_kinds(view: Any, rule_id: int) -> list[str]:
    return [k.kind for k in view.session.query(ReminderRuleKind).filter(
        ReminderRuleKind.org_id == org_id(), ReminderRuleKind.rule_id == rule_id).order_by(ReminderRuleKind.position)]


def _offset_label(minutes: int) -> str:
    if minutes and minutes % 1440 == 0:
        return f"{minutes // 1440} dia(s)"
    if minutes and minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"


class ReminderRuleView(TenantModelView):
    """Reminder rules and their channel kinds in order (a comma list, validated)."""

    column_list = ("name", "purpose", "trigger", "offset_minutes", "kinds", "respect_window", "active")
    column_details_list = column_list + ("template_key", "created_at", "updated_at")
    column_export_list = column_list
    column_labels = {"name": "Nome", "purpose": "Finalidade", "trigger": "Gatilho", "offset_minutes": "Antecedência",
                     "kinds": "Canais (em ordem)", "respect_window": "Respeita horário permitido", "active": "Ativa",
                     "template_key": "Modelo", "created_at": "Criada em", "updated_at": "Atualizada em"}
    column_filters = ("active", "purpose", "trigger")
    column_formatters = {
        "kinds": lambda v, c, m, n: " → ".join(KIND_LABELS.get(k, k) for k in _rule_kinds(v, m.id)),
        "purpose": lambda v, c, m, n: PURPOSE_LABELS.get(m.purpose, m.purpose),
        "trigger": lambda v, c, m, n: dict(TRIGGERS).get(m.trigger, m.trigger),
        "offset_minutes": lambda v, c, m, n: _offset_label(m.offset_minutes),
    }
    column_formatters_export = {"kinds": lambda v, c, m, n: ",".join(_rule_kinds(v, m.id))}
    allow_delete = False
    empty_message = "Nenhuma regra. Crie uma (ex.: 24 h antes, whatsapp, sms) para que os agendamentos gerem lembretes."
    audit_entity = "reminder_rules"

    def scaffold_form(self) -> Any:
        purposes = [(k, PURPOSE_LABELS[k]) for k in ("session_reminder", "session_confirmation", "session_cancellation")]

        class RuleForm(self.form_base_class):  # type: ignore[name-defined,misc]
            name = StringField("Nome", validators=[DataRequired(message="Dê um nome à regra."), Length(max=200)])
            purpose = SelectField("Finalidade", choices=purposes)
            template_key = SelectField("Modelo", choices=purposes)
            trigger = SelectField("Gatilho", choices=TRIGGERS)
            offset_minutes = IntegerField("Antecedência (minutos)", default=1440,
                                          validators=[NumberRange(min=0, max=60 * 24 * 60, message="Entre 0 e 86400.")])
            kinds = StringField("Canais, em ordem de preferência", default="whatsapp",
                                description="Separados por vírgula: whatsapp, sms, email. Se o primeiro falhar ou não "
                                            "tiver consentimento, usa o próximo.")
            respect_window = BooleanField("Respeitar horário permitido, domingos e feriados", default=True)
            active = BooleanField("Ativa", default=True)

            def validate_kinds(self, field: Any) -> None:
                parse_kinds(field.data)
        return RuleForm

    def on_form_prefill(self, form: Any, id: Any) -> None:
        form.kinds.data = ", ".join(_rule_kinds(self, int(id)))

    def on_model_change(self, form: Any, model: Any, is_created: bool) -> None:
        kinds = parse_kinds(form.kinds.data)
        super().on_model_change(form, model, is_created)  # flushes, audits
        conn = self.session.connection()
        old = _rule_kinds(self, model.id)
        if old != kinds:
            conn.execute(delete(reminder_rule_kinds).where(reminder_rule_kinds.c.org_id == org_id(),
                                                          reminder_rule_kinds.c.rule_id == model.id))
            for position, kind in enumerate(kinds):
                conn.execute(insert(reminder_rule_kinds).values(org_id=org_id(), rule_id=model.id, kind=kind,
                                                                position=position))
            write_audit(conn, "update", "reminder_rule_kinds", model.id, {"kinds": kinds})
