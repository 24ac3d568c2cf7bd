"""Agendamentos and Contatos (the reminder rules are in admin/views/rules.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from flask import abort, flash, redirect, request, url_for
from flask_admin import expose
from flask_admin.actions import action
from flask_admin.contrib.sqla.filters import FilterEqual
from markupsafe import Markup
from sqlalchemy import update
from werkzeug.datastructures import CombinedMultiDict
from wtforms import (
    FileField,
    SelectField,
    SelectMultipleField,
    StringField,
)
from wtforms.fields import DateTimeLocalField
from wtforms.validators import (
    DataRequired,
    Email,
    Length,
    Optional,
    ValidationError,
)

from admin.i18n import _, _l, ngettext, translate
from admin.views.base import (
    KIND_LABELS,
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
from admin.views.filters import OrgDateTimeBetweenFilter
from admin.views.followup.handoff import ContactFollowupMixin
from admin.views.privacy import ContactPrivacyMixin
from engine import appointments as appts
from engine import clock
from engine import imports as csv_import
from engine.contacts import ExternalIdTaken, create_contact, external_id_taken
from engine.models import (
    APPOINTMENT_STATUSES,
    CHANNEL_KINDS,
    Appointment,
    Contact,
    Preference,
    appointments,
    contacts,
)
from engine.orgs import DomainError
from engine.populate import refresh_appointment
from gateway.phones import InvalidPhone, normalize_phone

STATUS_CHOICES = [("scheduled", _l("Agendado")), ("confirmed", _l("Confirmado")), ("cancelled", _l("Cancelado")),
                  ("completed", _l("Realizado")), ("no_show", _l("Faltou"))]
MODE_CHOICES = [("", "—"), ("in_person", _l("Presencial")), ("online", _l("Online"))]


def _contact_name(session: Any, contact_id: int | None) -> str:
    if contact_id is None:
        return "—"
    row = session.query(Contact).filter(Contact.org_id == org_id(), Contact.id == contact_id).one_or_none()
    return (row.name or _("Contato %(id)s", id=row.id)) if row else "—"


class ImportForm(TenantSecureForm):
    """The CSV upload (the token is checked by the app's CSRFProtect and by the form)."""

    file = FileField(_l("Arquivo CSV"))


#: Errors listed on the result page; the counts always cover all of them.
IMPORT_ERRORS_SHOWN = 1000
_YES, _NO = _l("sim"), _l("não")
IMPORT_COLUMNS = [
    ("external_id", _YES, _l("ID do agendamento no seu sistema (atualiza se já existir)")),
    ("contact_external_id", _YES, _l("ID do paciente no seu sistema")),
    ("contact_name", _YES, _l("Nome do paciente")),
    ("phone", _NO, _l("Celular com DDD, ex.: (16) 99988-7766")),
    ("email", _NO, _l("E-mail do paciente")),
    ("starts_at", _YES, _l("dd/mm/aaaa hh:mm (horário da clínica) ou ISO 8601 com fuso, ex.: "
                           "2026-12-03T14:30-03:00")),
    ("professional", _NO, _l("Profissional")),
    ("mode", _NO, _l("presencial ou online")),
    ("location", _NO, _l("Local / sala")),
    ("status", _NO, _l("agendado, confirmado, cancelado, realizado ou faltou")),
    ("consent", _NO, _l("Canais que o paciente aceitou, separados por |, ex.: whatsapp|email")),
]


# ------------------------------------------------------------------------------------------------
class AppointmentView(TenantModelView):
    """Appointments, written through engine.appointments; every change re-populates at once."""

    column_list = ("starts_at", "contact_id", "professional", "mode", "location", "status", "external_id")
    column_details_list = column_list + ("timezone", "confirmed_at", "cancelled_at", "cancel_source", "created_at",
                                         "updated_at")
    column_export_list = column_list
    column_labels = {
        "starts_at": _l("Início"), "contact_id": _l("Paciente"), "professional": _l("Profissional"),
        "mode": _l("Modalidade"), "location": _l("Local"), "status": _l("Status"), "external_id": _l("ID externo"),
        "timezone": _l("Fuso horário"), "confirmed_at": _l("Confirmado em"), "cancelled_at": _l("Cancelado em"),
        "cancel_source": _l("Cancelado por"), "created_at": _l("Criado em"), "updated_at": _l("Atualizado em"),
    }
    column_sortable_list = ("starts_at", "status", "professional")
    column_default_sort = ("starts_at", True)
    column_searchable_list = ("professional", "external_id", "location")
    column_filters = (FilterEqual(Appointment.status, _l("Status"), options=[(k, v) for k, v in STATUS_CHOICES]),
                      OrgDateTimeBetweenFilter(Appointment.starts_at, _l("Início")), "professional")
    column_choices = {"status": [(s, s) for s in APPOINTMENT_STATUSES]}
    empty_message = _l("Nenhum agendamento. Crie um aqui, importe uma planilha CSV ou envie pela API; os lembretes "
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
            flash(_("Arquivo grande demais: o limite é %(mb)d MB. Divida-o em partes.",
                    mb=csv_import.MAX_BYTES // (1024 * 1024)), "error")
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
                form.file.errors = [_("Escolha um arquivo CSV.")]
            else:
                try:
                    report = csv_import.import_appointments(runtime().db, org_id(), upload.stream)
                except csv_import.ImportFileError as exc:
                    flash(translate(exc.text), "error")
                else:
                    with runtime().db.begin() as conn:
                        write_audit(conn, "import", "appointments", None, report.counts())
                    flash(_("Importação concluída: %(criados)d agendamento(s) criado(s), %(atualizados)d "
                            "atualizado(s), %(iguais)d sem alteração, %(erros)d linha(s) com erro; %(lembretes)d "
                            "lembrete(s) na fila.", criados=report.created, atualizados=report.updated,
                            iguais=report.unchanged, erros=len(report.errors), lembretes=report.reminders_created),
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
            contact_id = SelectField(_l("Paciente"), coerce=int,
                                     validators=[DataRequired(message=_l("Escolha o paciente."))])
            starts_at = DateTimeLocalField(_l("Início (horário da clínica)"), format="%Y-%m-%dT%H:%M",
                                           validators=[DataRequired(message=_l("Informe data e hora."))])
            professional = StringField(_l("Profissional"), validators=[Optional(), Length(max=200)])
            mode = SelectField(_l("Modalidade"), choices=MODE_CHOICES, validators=[Optional()])
            location = StringField(_l("Local"), validators=[Optional(), Length(max=300)])
            status = SelectField(_l("Status"), choices=STATUS_CHOICES, default="scheduled")
            external_id = StringField(_l("ID externo"), validators=[Optional(), Length(max=200)])
        return AppointmentForm

    def _scope_choices(self, form: Any) -> Any:
        rows = self.session.query(Contact.id, Contact.name).filter(
            Contact.org_id == org_id(), Contact.erased_at.is_(None)).order_by(Contact.name).all()
        form.contact_id.choices = [(r.id, r.name or _("Contato %(id)s", id=r.id)) for r in rows]
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
            flash(_("Não foi possível salvar: %(erro)s", erro=exc), "error")
            return False
        flash(_("Agendamento criado; %(num)d lembrete(s) na fila.", num=getattr(result, "created", 0)), "success")
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
                appts.set_status(conn, oid, aid, before["status"], status)
                changes["status"] = status
            refresh_appointment(conn, oid, aid)
            write_audit(conn, "update", "appointments", aid, changes)
            self.session.commit()
        except DomainError as exc:
            self.session.rollback()
            flash(_("Não foi possível salvar: %(erro)s", erro=exc), "error")
            return False
        return True

    @action("cancel", _l("Cancelar agendamentos"),
            _l("Cancelar os agendamentos selecionados? Os lembretes pendentes deixam de sair."))
    def action_cancel(self, ids: Any) -> None:
        conn = self.session.connection()
        done = 0
        for aid in ids_of(ids):
            if appts.cancel(conn, org_id(), aid, source="clinic"):
                refresh_appointment(conn, org_id(), aid)
                write_audit(conn, "cancel", "appointments", aid, {"status": "cancelled"})
                done += 1
        self.session.commit()
        flash(ngettext("%(num)d agendamento cancelado.", "%(num)d agendamentos cancelados.", done) if done
              else _("Nenhum dos agendamentos selecionados podia ser cancelado."), "success" if done else "warning")


# ------------------------------------------------------------------------------------------------
def _consent_badges(view: Any, model: Any) -> Markup:
    rows = view.session.query(Preference).filter(Preference.org_id == org_id(),
                                                 Preference.contact_id == model.id).order_by(Preference.kind).all()
    none = Markup('<span class="text-muted">{}</span>').format(_("sem consentimento"))
    if not rows:
        return none
    parts = []
    for p in rows:
        label = KIND_LABELS.get(p.kind, p.kind)
        if p.opted_out_at is not None:
            parts.append(Markup('<span class="badge badge-danger" title="{}">{}</span>').format(
                _("saiu em %(quando)s", quando=local_dt(p.opted_out_at)), _("%(canal)s: saiu", canal=label)))
        elif p.opted_in:
            parts.append(Markup('<span class="badge badge-success" title="{}">{}</span>').format(
                _("desde %(quando)s", quando=local_dt(p.opted_in_at)), label))
    return Markup(" ").join(parts) or none


def _consent_history(view: Any, model: Any) -> Markup:
    rows = view.session.query(Preference).filter(Preference.org_id == org_id(),
                                                 Preference.contact_id == model.id).order_by(Preference.kind).all()
    items = [Markup("<li>{}: {}{}{}</li>").format(
        KIND_LABELS.get(p.kind, p.kind),
        _("aceitou em %(quando)s", quando=local_dt(p.opted_in_at)) if p.opted_in_at else _("sem aceite"),
        "; " + _("saiu em %(quando)s", quando=local_dt(p.opted_out_at)) if p.opted_out_at else "",
        " (" + _("origem: %(origem)s", origem=p.source) + ")" if p.source else "") for p in rows]
    return Markup("<ul class='mb-0'>{}</ul>").format(Markup("").join(items)) if items else Markup("—")


def _consent_text(view: Any, model: Any) -> str:
    rows = view.session.query(Preference).filter(Preference.org_id == org_id(), Preference.contact_id == model.id).all()
    return ", ".join(f"{p.kind}:{_('saiu') if p.opted_out_at else (_('sim') if p.opted_in else _('não'))}"
                     for p in rows)


def _external_id_taken_message() -> str:
    return _("Não foi possível salvar: outro contato desta clínica já usa este identificador externo. "
             "Cada paciente do sistema da clínica tem o seu.")


class ContactView(ContactFollowupMixin, ContactPrivacyMixin, TenantModelView):
    """Contacts; consent and opt-out history are shown, never edited here. Follow-up (hand-off,
    enrolling by hand) comes from ContactFollowupMixin (admin/views/followup/handoff.py)."""

    column_list = ("name", "phone", "email", "external_id", "consent", "created_at")
    column_details_list = ("name", "phone", "email", "external_id", "locale", "consent_history", "created_at",
                           "updated_at")
    column_export_list = ("name", "phone", "email", "external_id", "consent_text", "created_at")
    column_labels = {"name": _l("Nome"), "phone": _l("Telefone"), "email": _l("E-mail"),
                     "external_id": _l("ID externo"), "locale": _l("Idioma"), "consent": _l("Consentimento"),
                     "consent_history": _l("Consentimento e descadastros"), "consent_text": _l("Consentimento"),
                     "created_at": _l("Criado em"), "updated_at": _l("Atualizado em")}
    column_searchable_list = ("name", "phone", "email", "external_id")
    column_sortable_list = ("name", "created_at")
    column_default_sort = ("name", False)
    column_filters = ("name", OrgDateTimeBetweenFilter(Contact.created_at, _l("Criado em")))
    column_formatters = {"consent": lambda v, c, m, n: _consent_badges(v, m),
                         "consent_history": lambda v, c, m, n: _consent_history(v, m)}
    column_formatters_detail = column_formatters
    column_formatters_export = {"consent_text": lambda v, c, m, n: _consent_text(v, m)}
    empty_message = _l("Nenhum contato. Cadastre um paciente aqui ou envie pela API; depois crie um agendamento "
                       "para ele.")

    def get_query(self) -> Any:
        return super().get_query().filter(Contact.erased_at.is_(None))

    def get_count_query(self) -> Any:
        return super().get_count_query().filter(Contact.erased_at.is_(None))

    def scaffold_form(self) -> Any:
        class ContactForm(self.form_base_class):  # type: ignore[name-defined,misc]
            name = StringField(_l("Nome"), validators=[DataRequired(message=_l("Informe o nome.")), Length(max=200)])
            phone = StringField(_l("Telefone (com DDD)"), validators=[Optional(), Length(max=40)])
            email = StringField(_l("E-mail"), validators=[Optional(), Email(message=_l("E-mail inválido.")),
                                                          Length(max=200)])
            external_id = StringField(_l("ID externo"), validators=[Optional(), Length(max=200)])
            locale = SelectField(_l("Idioma"), choices=[("", _l("Padrão da clínica")), ("pt_BR", _l("Português")),
                                                        ("en", _l("Inglês")), ("es", _l("Espanhol"))],
                                 validators=[Optional()])
            consent = SelectMultipleField(_l("Consentiu receber por"),
                                          choices=[(k, KIND_LABELS[k]) for k in CHANNEL_KINDS],
                                          default=list(CHANNEL_KINDS))

            def validate_phone(self, field: Any) -> None:
                if field.data:
                    try:
                        normalize_phone(field.data)
                    except InvalidPhone:
                        raise ValidationError(_("Telefone inválido.")) from None
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
        except ExternalIdTaken:
            self.session.rollback()
            flash(_external_id_taken_message(), "error")
            return False
        except DomainError as exc:
            self.session.rollback()
            flash(_("Não foi possível salvar: %(erro)s", erro=exc), "error")
            return False
        return self.get_one(contact_id)

    def update_model(self, form: Any, model: Any) -> bool:
        conn = self.session.connection()
        values = {"name": form.name.data.strip(), "phone": normalize_phone(form.phone.data) if form.phone.data else None,
                  "email": form.email.data.strip().lower() if form.email.data else None,
                  "external_id": form.external_id.data or None, "locale": form.locale.data or None}
        diff = {k: v for k, v in values.items() if getattr(model, k) != v}
        if diff.get("external_id") and external_id_taken(conn, org_id(), diff["external_id"], other_than=model.id):
            self.session.rollback()
            flash(_external_id_taken_message(), "error")
            return False
        if diff:
            conn.execute(update(contacts).where(contacts.c.org_id == org_id(), contacts.c.id == model.id)
                         .values(**diff, updated_at=clock.now()))
            write_audit(conn, "update", "contacts", model.id, {k: "(alterado)" for k in diff})  # no PII in the log
        self.session.commit()
        return True

    @action("enroll", _l("Incluir em fluxo de follow-up"))
    def action_enroll(self, ids: Any) -> Any:
        """List action: on to the page that asks which published flow (ContactFollowupMixin)."""
        return self.enroll_action(ids)
