"""Agendamentos and Contatos (the reminder rules are in admin/views/settings/rules.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from flask import abort, flash, jsonify, redirect, render_template, request, url_for
from flask_admin import expose
from flask_admin.actions import action
from flask_admin.contrib.sqla.filters import FilterEqual
from flask_login import current_user
from markupsafe import Markup
from sqlalchemy import select, update
from werkzeug.datastructures import CombinedMultiDict
from wtforms import (
    Field,
    FileField,
    SelectField,
    SelectMultipleField,
    StringField,
)
from wtforms.fields import DateTimeLocalField
from wtforms.widgets import CheckboxInput, ListWidget
from wtforms.validators import (
    DataRequired,
    Email,
    Length,
    Optional,
    ValidationError,
)

from admin.i18n import _, _l, ngettext, translate
from admin.ids import parse_id
from admin.views.base import (
    KIND_LABELS,
    PURPOSE_LABELS,
    TenantModelView,
    TenantSecureForm,
    badge,
    db_session,
    ids_of,
    is_editor,
    local_dt,
    org_id,
    org_timezone,
    runtime,
    select_choices,
    write_audit,
)
from admin.views.filters import OrgDateTimeBetweenFilter, PatientSearchMixin
from admin.views.followup.handoff import ContactFollowupMixin
from admin.views.desk.privacy import ContactPrivacyMixin
from admin.views.desk.composer import ComposerMixin
from engine.people import appointments as appts
from engine.core import clock
from engine.people import imports as csv_import
from engine.words.catalogue import describe
from engine.people.contacts import (
    CONSENT_METHODS,
    ExternalIdTaken,
    create_contact,
    external_id_taken,
    matching,
    set_consent,
)
from engine.store.models import (
    APPOINTMENT_STATUSES,
    CHANNEL_KINDS,
    Appointment,
    Contact,
    Preference,
    User,
    appointments,
    channels,
    contacts,
    inbound_messages,
    messages,
)
from engine.core.errors import DomainError
from engine.reminders.populate import DEFAULT_HORIZON, refresh_appointment
from engine.queue import address_optouts as addresses
from gateway.phones import InvalidPhone, normalize_phone

STATUS_CHOICES = [("scheduled", _l("Agendado")), ("confirmed", _l("Confirmado")), ("cancelled", _l("Cancelado")),
                  ("completed", _l("Realizado")), ("no_show", _l("Faltou"))]
#: An appointment's status in its own (masculine) words: "Cancelado" beside "Agendado".
APPOINTMENT_STATUS_LABELS = dict(STATUS_CHOICES)
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


#: Patients offered by one lookup: enough to pick from, few enough to read.
LOOKUP_LIMIT = 20
#: Messages and replies listed on an appointment's or a contact's page (the latest ones).
HISTORY_ROWS = 50


# --- picking a patient ----------------------------------------------------------------------------
class PatientLookupWidget:
    """A search box that asks the org's contacts as one types (AppointmentView.patient_lookup);
    the chosen id goes in a hidden input. A clinic with thousands of patients gets no dropdown of
    every one of them."""

    def __call__(self, field: "PatientField", **kwargs: Any) -> Markup:
        return Markup(render_template("admin/patient_lookup_field.html", field=field, url=field.lookup_url,
                                      display=field.display, css=kwargs.get("class", "")))


class PatientField(Field):
    """The appointment's patient, by id; the view checks that the id is one of its org's
    contacts (PatientField never lists anyone)."""

    widget = PatientLookupWidget()
    lookup_url = ""
    display = ""

    def process_formdata(self, valuelist: list[Any]) -> None:
        self.data = parse_id(str(valuelist[0])) if valuelist and valuelist[0] else None

    def _value(self) -> str:
        return str(self.data) if self.data else ""


def _patient(contact_id: int) -> Any:
    """The signed-in org's live contact with that id, or None."""
    return db_session().query(Contact).filter(Contact.org_id == org_id(), Contact.id == contact_id,
                                             Contact.erased_at.is_(None)).one_or_none()


def _contact_label(row: Any) -> str:
    return row.name or _("Contato %(id)s", id=row.id)


def _contact_detail(row: Any) -> str:
    """What tells two patients of the same name apart: the phone, else the e-mail."""
    return row.phone or row.email or ""


# --- a patient's messages and replies ---------------------------------------------------------------
def patient_history(conn: Any, org_id_: int, *, contact_id: int | None = None,
                    appointment_id: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """The latest messages of a contact or of an appointment, and the replies to them (a
    contact's: every reply it sent; an appointment's: those answering one of its messages)."""
    from admin.views.words import message_reason_text, reply_outcome_text

    where = [messages.c.org_id == org_id_]
    where.append(messages.c.contact_id == contact_id if appointment_id is None
                 else messages.c.appointment_id == appointment_id)
    sent = conn.execute(select(messages).where(*where).order_by(messages.c.id.desc()).limit(HISTORY_ROWS)).all()
    rows = [{
        "id": m.id, "purpose": PURPOSE_LABELS.get(m.purpose, m.purpose), "kind": KIND_LABELS.get(m.channel_kind,
                                                                                                 m.channel_kind),
        "status": badge(m.status), "when": local_dt(m.sent_at or m.due_at or m.nominal_due_at or m.created_at),
        "reason": message_reason_text(m),
    } for m in sent]
    im = inbound_messages
    reply_where = [im.c.org_id == org_id_]
    if appointment_id is None:
        reply_where.append(im.c.contact_id == contact_id)
    else:
        provider_ids = select(messages.c.provider_message_id).where(
            messages.c.org_id == org_id_, messages.c.appointment_id == appointment_id,
            messages.c.provider_message_id.is_not(None))
        reply_where.append(im.c.in_reply_to.in_(provider_ids))
    got = conn.execute(
        select(im.c.id, im.c.text, im.c.button_payload, im.c.received_at, im.c.outcome, channels.c.kind)
        .join(channels, (channels.c.id == im.c.channel_id) & (channels.c.org_id == org_id_))
        .where(*reply_where).order_by(im.c.id.desc()).limit(HISTORY_ROWS)).all()
    replies = [{
        "when": local_dt(r.received_at), "kind": KIND_LABELS.get(r.kind, r.kind),
        "text": (r.text or "")[:300], "outcome": reply_outcome_text(r.outcome),
    } for r in got]
    return {"messages": rows, "replies": replies}


# --- what the reminders of a booking will do --------------------------------------------------------
def flash_outlook(conn: Any, org_id_: int, appointment_id: int, verb: str) -> None:
    """One message after the appointment was saved: how many reminders are queued and, when the
    time has passed or some reminder cannot go, a warning that lists each skipped one with why."""
    from admin.views.settings.rules import timing_label

    outlook = appts.reminder_outlook(conn, org_id_, appointment_id, horizon=DEFAULT_HORIZON)
    created = verb == "create"
    if not outlook.skipped and not outlook.in_past:
        if created:
            flash(ngettext("Agendamento criado; %(num)d lembrete na fila.", "Agendamento criado; %(num)d lembretes na fila.",
                           outlook.queued), "success")
        return
    if outlook.in_past:
        head = (_("Agendamento criado com um horário que já passou: nenhum lembrete vai sair.") if created
                else _("Agendamento salvo com um horário que já passou: nenhum lembrete vai sair."))
        if outlook.queued:  # an after-start follow-up still goes
            head = (ngettext("Agendamento criado com um horário que já passou; %(num)d mensagem na fila.",
                             "Agendamento criado com um horário que já passou; %(num)d mensagens na fila.",
                             outlook.queued) if created
                    else ngettext("Agendamento salvo com um horário que já passou; %(num)d mensagem na fila.",
                                  "Agendamento salvo com um horário que já passou; %(num)d mensagens na fila.",
                                  outlook.queued))
    elif not outlook.queued:
        head = (_("Agendamento criado, mas nenhum lembrete vai sair:") if created
                else _("Agendamento salvo, mas nenhum lembrete vai sair:"))
    else:
        queued = ngettext("%(num)d lembrete na fila", "%(num)d lembretes na fila", outlook.queued)
        skipped = ngettext("%(num)d não vai sair", "%(num)d não vão sair", len(outlook.skipped))
        head = (_("Agendamento criado; %(queued)s, %(skipped)s.", queued=queued, skipped=skipped) if created
                else _("Agendamento salvo; %(queued)s, %(skipped)s.", queued=queued, skipped=skipped))
    items = [Markup("<li>{} ({}): {}</li>").format(s.rule_name, timing_label(s.trigger, s.offset_minutes),
                                                  translate(describe(s.reason))) for s in outlook.skipped]
    body = Markup("{}<ul class='mb-0'>{}</ul>").format(head, Markup("").join(items)) if items else Markup(
        "{}").format(head)
    flash(body, "warning")


# ------------------------------------------------------------------------------------------------
class AppointmentView(PatientSearchMixin, TenantModelView):
    """Appointments, written through engine.people.appointments; every change re-populates at once, and
    the one who saved it is told which reminders will not go and why. The list's search finds the
    patient by name or phone; the form picks the patient with a search box (patient_lookup)."""

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
    details_template = "admin/appointment_details.html"

    @expose("/patients/")
    def patient_lookup(self) -> Any:
        """JSON for the patient search box: up to LOOKUP_LIMIT of the signed-in org's contacts
        (never an erased one) that `q` finds by name, phone, e-mail or external id."""
        text = (request.args.get("q") or "").strip()[:100]
        results: list[dict[str, Any]] = []
        if text:
            oid = org_id()
            rows = self.session.connection().execute(
                select(contacts.c.id, contacts.c.name, contacts.c.phone, contacts.c.email)
                .where(contacts.c.org_id == oid, contacts.c.id.in_(matching(oid, text)))
                .order_by(contacts.c.name, contacts.c.id).limit(LOOKUP_LIMIT)).all()
            self.session.rollback()
            results = [{"id": r.id, "label": _contact_label(r), "detail": _contact_detail(r)} for r in rows]
        response = jsonify(results=results)
        response.headers["Cache-Control"] = "no-store"
        return response

    def render(self, template: str, **kwargs: Any) -> Any:
        model = kwargs.get("model")
        if template == self.details_template and model is not None:
            kwargs["history"] = patient_history(self.session.connection(), org_id(), appointment_id=model.id)
        return super().render(template, **kwargs)

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
                    flash(_("Importação concluída: %(criados)s, %(atualizados)s, %(iguais)s, %(erros)s; "
                            "%(lembretes)s.",
                            criados=ngettext("%(num)d agendamento criado", "%(num)d agendamentos criados",
                                             report.created),
                            atualizados=ngettext("%(num)d atualizado", "%(num)d atualizados", report.updated),
                            iguais=_("%(num)d sem alteração", num=report.unchanged),
                            erros=ngettext("%(num)d linha com erro", "%(num)d linhas com erro", len(report.errors)),
                            lembretes=ngettext("%(num)d lembrete na fila", "%(num)d lembretes na fila",
                                               report.reminders_created)),
                          "warning" if report.errors else "success")
        return self.render("admin/appointment_import.html", form=form, report=report, columns=IMPORT_COLUMNS,
                           example_header=csv_import.EXAMPLE_HEADER, example_line=csv_import.EXAMPLE_LINE,
                           max_mb=csv_import.MAX_BYTES // (1024 * 1024), max_rows=csv_import.MAX_ROWS,
                           errors_shown=IMPORT_ERRORS_SHOWN)

    column_formatters = {
        "contact_id": lambda v, c, m, n: _contact_name(v.session, m.contact_id),
        "status": lambda v, c, m, n: badge(m.status, APPOINTMENT_STATUS_LABELS),
        "mode": lambda v, c, m, n: dict(MODE_CHOICES).get(m.mode or "", m.mode),
        "starts_at": lambda v, c, m, n: local_dt(m.starts_at),
    }
    column_formatters_export = {
        "contact_id": lambda v, c, m, n: _contact_name(v.session, m.contact_id),
        "starts_at": lambda v, c, m, n: local_dt(m.starts_at),
    }

    def scaffold_form(self) -> Any:
        class AppointmentForm(self.form_base_class):  # type: ignore[name-defined,misc]
            contact_id = PatientField(_l("Paciente"), validators=[DataRequired(message=_l("Escolha o paciente."))])
            starts_at = DateTimeLocalField(_l("Início (horário da clínica)"), format="%Y-%m-%dT%H:%M",
                                           validators=[DataRequired(message=_l("Informe data e hora."))])
            professional = StringField(_l("Profissional"), validators=[Optional(), Length(max=200)])
            mode = SelectField(_l("Modalidade"), choices=select_choices(MODE_CHOICES), validators=[Optional()])
            location = StringField(_l("Local"), validators=[Optional(), Length(max=300)])
            status = SelectField(_l("Status"), choices=select_choices(STATUS_CHOICES), default="scheduled")
            external_id = StringField(_l("ID externo"), validators=[Optional(), Length(max=200)])

            def validate_contact_id(self, field: Any) -> None:
                # The id comes from the browser: only a live contact of the signed-in org is one.
                if field.data is not None and _patient(field.data) is None:
                    raise ValidationError(_("Escolha o paciente."))
        return AppointmentForm

    def _bind_patient(self, form: Any) -> Any:
        form.contact_id.lookup_url = self.get_url(".patient_lookup")
        row = _patient(form.contact_id.data) if form.contact_id.data else None
        form.contact_id.display = _contact_label(row) if row is not None else ""
        return form

    def create_form(self, obj: Any = None) -> Any:
        return self._bind_patient(super().create_form(obj))

    def edit_form(self, obj: Any = None) -> Any:
        return self._bind_patient(super().edit_form(obj))

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
            refresh_appointment(conn, org_id(), appointment_id)
            write_audit(conn, "create", "appointments", appointment_id, {
                "contact_id": form.contact_id.data, "starts_at": self._starts_at(form),
                "professional": form.professional.data, "status": form.status.data,
            })
            self.session.commit()
        except DomainError as exc:
            self.session.rollback()
            flash(_("Não foi possível salvar: %(erro)s", erro=exc), "error")
            return False
        flash_outlook(self.session.connection(), org_id(), appointment_id, "create")
        self.session.rollback()  # the outlook only read
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
        # Only a change that decides the reminders says what they do (not marking one as done).
        if changes.keys() & {"starts_at", "contact_id"} or changes.get("status") in appts.LIVE:
            flash_outlook(self.session.connection(), oid, aid, "update")
            self.session.rollback()
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


#: How consent was given, by `preferences.source` (the console's methods, then what the API, the
#: CSV import and the engine write). A source without a label is not shown raw.
CONSENT_SOURCE_LABELS = {
    "reception_verbal": _l("verbal na recepção"), "signed_form": _l("formulário assinado"),
    "whatsapp": _l("pelo WhatsApp"), "phone_call": _l("por telefone"),
    "clinic": _l("pela clínica"), "api": _l("pela API (sistema da clínica)"), "console": _l("no console"),
    "demo": _l("dados de demonstração"), "provider": _l("pelo provedor"),
    "flow_reply": _l("por mensagem, numa conversa de um fluxo"),
}
#: The methods a receptionist picks from when recording consent (engine.people.contacts.CONSENT_METHODS).
CONSENT_METHOD_CHOICES = [(m, CONSENT_SOURCE_LABELS[m]) for m in CONSENT_METHODS]


def _who(conn: Any, evidence: str | None) -> str:
    """Who recorded it: a console user (`user:ID`) by e-mail, the CSV import by name."""
    if evidence == csv_import.EVIDENCE:
        return _("importação CSV")
    pk = parse_id(evidence[5:]) if evidence and evidence.startswith("user:") else None
    if pk is None:
        return ""
    email = conn.execute(select(User.__table__.c.email).where(User.__table__.c.org_id == org_id(),
                                                              User.__table__.c.id == pk)).scalar()
    return email or _("usuário removido")


def _consent_history(view: Any, model: Any) -> Markup:
    rows = view.session.query(Preference).filter(Preference.org_id == org_id(),
                                                 Preference.contact_id == model.id).order_by(Preference.kind).all()
    conn = view.session.connection()
    items = []
    for p in rows:
        how = CONSENT_SOURCE_LABELS.get(p.source or "", "")
        who = _who(conn, p.evidence)
        origin = ", ".join(str(x) for x in (how, who) if x)
        items.append(Markup("<li>{}: {}{}{}</li>").format(
            KIND_LABELS.get(p.kind, p.kind),
            _("aceitou em %(quando)s", quando=local_dt(p.opted_in_at)) if p.opted_in_at else _("sem aceite"),
            "; " + _("saiu em %(quando)s", quando=local_dt(p.opted_out_at)) if p.opted_out_at else "",
            " (" + _("como: %(como)s", como=origin) + ")" if origin else ""))
    return Markup("<ul class='mb-0'>{}</ul>").format(Markup("").join(items)) if items else Markup("—")


def _consent_state(conn: Any, contact: Any) -> dict[str, list[str]]:
    """Per kind, for the details page's consent form: agreed, refused (by the patient, for the
    contact or its phone/e-mail: not re-opened by the clinic) or open to record."""
    prefs = {p.kind: p for p in conn.execute(select(Preference.__table__).where(
        Preference.__table__.c.org_id == org_id(), Preference.__table__.c.contact_id == contact.id))}
    refused = addresses.refused_kinds_for(conn, org_id(), addresses.addresses_of(contact.phone, contact.email))
    state: dict[str, list[str]] = {"agreed": [], "refused": [], "open": []}
    for kind in CHANNEL_KINDS:
        p = prefs.get(kind)
        if kind in refused or (p is not None and p.opted_out_at is not None):
            state["refused"].append(kind)
        elif p is not None and p.opted_in:
            state["agreed"].append(kind)
        else:
            state["open"].append(kind)
    return state


class ConsentForm(TenantSecureForm):
    """Consent told to the clinic: which channels, and how the patient gave it."""

    kinds = SelectMultipleField(_l("Canais"), choices=select_choices((k, KIND_LABELS[k]) for k in CHANNEL_KINDS),
                                widget=ListWidget(prefix_label=False), option_widget=CheckboxInput())
    method = SelectField(_l("Como o paciente consentiu"), choices=select_choices([("", "—")] + CONSENT_METHOD_CHOICES),
                         validate_choice=False)  # checked by the view, which says what is missing


def _consent_text(view: Any, model: Any) -> str:
    rows = view.session.query(Preference).filter(Preference.org_id == org_id(), Preference.contact_id == model.id).all()
    return ", ".join(f"{p.kind}:{_('saiu') if p.opted_out_at else (_('sim') if p.opted_in else _('não'))}"
                     for p in rows)


def _external_id_taken_message() -> str:
    return _("Não foi possível salvar: outro contato desta clínica já usa este identificador externo. "
             "Cada paciente do sistema da clínica tem o seu.")


class ContactView(PatientSearchMixin, ComposerMixin, ContactFollowupMixin, ContactPrivacyMixin, TenantModelView):
    """Contacts. Consent is a deliberate act with its evidence: nothing is ticked on a new
    contact, and ticking a channel (on the form or later on the contact's page) asks how the
    patient agreed and records who did it and when; a refusal is never re-opened here. The
    page lists the patient's messages and replies, and staff write to the patient there
    (ComposerMixin, admin/views/desk/composer.py). Follow-up (hand-off, enrolling by hand)
    comes from ContactFollowupMixin (admin/views/followup/handoff.py)."""

    patient_column = "id"

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
            locale = SelectField(_l("Idioma"), choices=select_choices([("", _l("Padrão da clínica")),
                                                                       ("pt_BR", _l("Português")),
                                                                       ("en", _l("Inglês")), ("es", _l("Espanhol"))]),
                                 validators=[Optional()])
            consent = SelectMultipleField(_l("Consentiu receber por"),
                                          choices=select_choices((k, KIND_LABELS[k]) for k in CHANNEL_KINDS),
                                          default=[],
                                          widget=ListWidget(prefix_label=False), option_widget=CheckboxInput(),
                                          description=_l("Marque só os canais que o paciente aceitou agora."))
            consent_method = SelectField(_l("Como o paciente consentiu"),
                                         choices=select_choices([("", "—")] + CONSENT_METHOD_CHOICES),
                                         validate_choice=False)

            def validate_consent_method(self, field: Any) -> None:
                # Asked only when a channel is ticked; then one of the methods, nothing else.
                if self.consent.data and field.data not in CONSENT_METHODS:
                    raise ValidationError(_("Diga como o paciente consentiu (verbal, formulário, WhatsApp…)."))

            def validate_phone(self, field: Any) -> None:
                if field.data:
                    try:
                        normalize_phone(field.data)
                    except InvalidPhone:
                        raise ValidationError(_("Telefone inválido.")) from None
        return ContactForm

    def edit_form(self, obj: Any = None) -> Any:
        form = super().edit_form(obj)
        # Consent is recorded on the contact's page, with its evidence (record_consent_view).
        del form.consent
        del form.consent_method
        return form

    def create_model(self, form: Any) -> Any:
        conn = self.session.connection()
        try:
            contact_id = create_contact(
                conn, org_id=org_id(), name=form.name.data.strip(), phone=form.phone.data or None,
                email=form.email.data or None, external_id=form.external_id.data or None,
                locale=form.locale.data or None, consent=form.consent.data or (),
                consent_source=form.consent_method.data or "console",
                consent_evidence=f"user:{int(current_user.id)}",
            )
            write_audit(conn, "create", "contacts", contact_id, {
                "consent": form.consent.data or [], "consent_method": form.consent_method.data or None})
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

    def render(self, template: str, **kwargs: Any) -> Any:
        model = kwargs.get("model")
        if template == self.details_template and model is not None:
            conn = self.session.connection()
            kwargs["history"] = patient_history(conn, org_id(), contact_id=model.id)
            state = kwargs["consent_state"] = _consent_state(conn, model)
            kwargs["consent_refused"] = ", ".join(str(KIND_LABELS[k]) for k in state["refused"])
            kwargs["consent_form"] = ConsentForm()
            kwargs["kind_labels"] = KIND_LABELS
        return super().render(template, **kwargs)

    @expose("/consent/<int:id>/record/", methods=("POST",))
    def record_consent_view(self, id: int) -> Any:
        """Consent the patient gave the clinic for more channels: how (the chosen method), who
        (the signed-in user) and when (now) go in its preferences row and the audit log."""
        if not is_editor():
            abort(403)
        model = self.get_one(id)
        back = redirect(self.get_url(".details_view", id=model.id))
        form = ConsentForm(request.form)
        conn = self.session.connection()
        if not form.validate():
            flash(_("Não foi possível registrar o consentimento; recarregue a página e tente de novo."), "error")
            return back
        kinds = [k for k in form.kinds.data or () if k in CHANNEL_KINDS]
        if not kinds:
            flash(_("Marque ao menos um canal que o paciente aceitou."), "error")
            return back
        if form.method.data not in CONSENT_METHODS:
            flash(_("Diga como o paciente consentiu (verbal, formulário, WhatsApp…)."), "error")
            return back
        state = _consent_state(conn, model)
        if set(kinds) & set(state["refused"]):
            self.session.rollback()
            flash(_("O paciente pediu para não receber mensagens por este canal; a clínica não pode reativá-lo."),
                  "error")
            return back
        for kind in kinds:
            set_consent(conn, org_id(), model.id, kind, source=form.method.data,
                        evidence=f"user:{int(current_user.id)}")
        write_audit(conn, "consent", "contacts", model.id, {"consent": sorted(kinds),
                                                            "consent_method": form.method.data})
        self.session.commit()
        flash(_("Consentimento registrado: %(canais)s.",
                canais=", ".join(str(KIND_LABELS[k]) for k in CHANNEL_KINDS if k in kinds)), "success")
        return back

    @action("enroll", _l("Incluir em fluxo de follow-up"))
    def action_enroll(self, ids: Any) -> Any:
        """List action: on to the page that asks which published flow (ContactFollowupMixin)."""
        return self.enroll_action(ids)
