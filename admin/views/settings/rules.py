"""Regras de lembrete: the clinic's reminder rules as one grid (rule × channel toggles, grouped by
purpose) plus the org's sending window, saved together; and the per-rule create/edit/details forms.

Semantics the page keeps (SPEC §4, reference 6.3 "Regras de Envio"):

- a rule's channel kinds are an ordered fallback list (`reminder_rule_kinds.position`); populate
  uses the first kind the patient consented to and the clinic has a working channel for. A toggle
  only turns kinds on or off: kinds still on keep their order, kinds turned on go to the end (in
  the grid's column order); the edit form is where the order itself is set;
- one "Salvar configurações" saves every toggle and the sending window in one transaction, with
  its audit rows, and makes the queue match in that same transaction (engine.reminders.rules.
  reflect_rule_changes): reminders still queued for the coming appointments are re-placed at
  their new time, those of a rule or kind switched off are cancelled, a rule switched on gets its
  reminders; the message says how many of each. Any validation error saves nothing;
- owner/manager edit, agent reads; every query names the signed-in user's org, and a POST naming
  another org's rule answers 404 with nothing changed.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import holidays
from flask import abort, flash, g, redirect, request, url_for
from flask_admin import expose
from sqlalchemy import select, update
from sqlalchemy.engine import Connection
from wtforms import BooleanField, IntegerField, SelectField, StringField
from wtforms.validators import DataRequired, Length, NumberRange, ValidationError

from admin.i18n import _, _l, ngettext
from admin.views.base import TenantModelView, is_editor, org_id, runtime, select_choices, write_audit
from engine.core import clock
from engine.store.models import (
    CHANNEL_KINDS,
    ReminderRuleKind,
    orgs,
    reminder_rule_kinds,
    reminder_rules,
)
from engine.core.errors import DomainError
from engine.reminders.windows import parse_hhmm, window_policy
from engine.reminders.rules import QueueChange, reflect_rule_changes, write_rule_kinds

TRIGGERS = [("before_start", _l("Antes do início")), ("after_start", _l("Depois do início")),
            ("on_create", _l("Ao agendar")), ("on_cancel", _l("Ao cancelar"))]
#: The purposes a rule can have, in the order the grid groups them, with the group titles.
RULE_PURPOSES = ("session_reminder", "session_confirmation", "session_cancellation")
PURPOSE_NAMES = {"session_reminder": _l("Lembrete de sessão"), "session_confirmation": _l("Confirmação de agendamento"),
                 "session_cancellation": _l("Aviso de cancelamento")}
GROUP_TITLES = {"session_reminder": _l("Lembrete de sessão"), "session_confirmation": _l("Confirmação"),
                "session_cancellation": _l("Cancelamento")}
GROUP_HINTS = {
    "session_reminder": _l("Enviado antes da sessão, para o paciente não esquecer."),
    "session_confirmation": _l("Enviado quando a sessão é agendada."),
    "session_cancellation": _l("Enviado quando a clínica cancela a sessão."),
}
#: Grid columns, left to right; also the order in which kinds turned on together are appended.
GRID_KINDS = ("whatsapp", "sms", "email")
KIND_NAMES = {"whatsapp": _l("WhatsApp"), "sms": _l("SMS"), "email": _l("E-mail")}
_HHMM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")
_ID = re.compile(r"^\d{1,18}$")
_FIELD = re.compile(r"^(kind|active)-(.+)$")
_TRIGGER_ORDER = {"on_create": 0, "before_start": 1, "after_start": 2, "on_cancel": 3}

assert set(GRID_KINDS) == set(CHANNEL_KINDS), "the grid must offer every channel kind"


# ------------------------------------------------------------------------------------------------
# Pure helpers
def parse_kinds(raw: str) -> list[str]:
    """The edit form's comma list of kinds ('whatsapp, sms'), validated, in the order written."""
    kinds = [k.strip().lower() for k in (raw or "").split(",") if k.strip()]
    bad = [k for k in kinds if k not in CHANNEL_KINDS]
    if bad:
        raise ValidationError(_("Canal desconhecido: %(bad)s. Use %(known)s.", bad=", ".join(bad),
                                known=", ".join(CHANNEL_KINDS)))
    if not kinds:
        raise ValidationError(_("Informe ao menos um canal (ex.: whatsapp, sms)."))
    if len(set(kinds)) != len(kinds):
        raise ValidationError(_("Cada canal só pode aparecer uma vez."))
    return kinds


def toggled_kinds(current: Sequence[str], turned_on: Iterable[str]) -> list[str]:
    """The rule's kinds after a toggle: kinds still on keep their order, new ones go at the end
    (in grid column order), so that a toggle never silently reorders the fallback list."""
    on = set(turned_on)
    kept = [k for k in current if k in on]
    return kept + [k for k in GRID_KINDS if k in on and k not in kept]


def _span(minutes: int) -> tuple[str, int]:
    """The unit a clinic would say an offset in: 24 h stays "24 horas", 2 days is "2 dias"."""
    if minutes >= 2 * 1440 and minutes % 1440 == 0:
        return "days", minutes // 1440
    if minutes >= 60 and minutes % 60 == 0:
        return "hours", minutes // 60
    return "minutes", minutes


def timing_label(trigger: str, offset_minutes: int) -> str:
    """When a rule sends, as a person says it: '24 horas antes', 'Imediata (ao criar)'."""
    if trigger == "on_create":
        return _("Imediata (ao criar)")
    if trigger == "on_cancel":
        return _("Imediata (ao cancelar)")
    minutes = max(int(offset_minutes or 0), 0)
    if minutes == 0:
        return _("No horário da sessão")
    unit, n = _span(minutes)
    if trigger == "after_start":
        if unit == "days":
            return ngettext("%(num)d dia depois", "%(num)d dias depois", n)
        if unit == "hours":
            return ngettext("%(num)d hora depois", "%(num)d horas depois", n)
        if minutes > 60:
            return _("%(h)d h %(m)d min depois", h=minutes // 60, m=minutes % 60)
        return _("%(num)d min depois", num=n)
    if unit == "days":
        return ngettext("%(num)d dia antes", "%(num)d dias antes", n)
    if unit == "hours":
        return ngettext("%(num)d hora antes", "%(num)d horas antes", n)
    if minutes > 60:
        return _("%(h)d h %(m)d min antes", h=minutes // 60, m=minutes % 60)
    return _("%(num)d min antes", num=n)


@functools.cache
def brazilian_states() -> tuple[tuple[str, str], ...]:
    """(UF, name) of every Brazilian state the `holidays` package knows holidays for, by name.
    Only the two-letter UFs: the package also lists a city ('São Paulo Capital'), not a state."""
    aliases = holidays.country_holidays("BR").get_subdivision_aliases()
    states = [(code, names[0] if names else code) for code, names in aliases.items()
              if len(code) == 2 and code.isalpha() and code.isupper()]
    return tuple(sorted(states, key=lambda s: unicodedata.normalize("NFKD", s[1]).encode("ascii", "ignore")))


# ------------------------------------------------------------------------------------------------
# What the page shows and what a POST asks for
@dataclass
class RuleRow:
    """One rule as the grid shows it (its saved state, or what was just posted)."""

    id: int
    name: str
    purpose: str
    trigger: str
    offset_minutes: int
    respect_window: bool
    active: bool
    kinds: list[str]
    error: str | None = None

    @property
    def timing(self) -> str:
        """When the rule sends, as the grid says it."""
        return timing_label(self.trigger, self.offset_minutes)


@dataclass
class Window:
    """The org's sending window as the form holds it ('HH:MM' text, as stored in orgs)."""

    quiet_start: str
    quiet_end: str
    skip_sundays: bool
    skip_holidays: bool
    state: str  # '' = national holidays only
    errors: dict[str, str] = field(default_factory=dict)

    def values(self) -> dict[str, Any]:
        """The orgs columns this window writes."""
        return {"quiet_start": self.quiet_start, "quiet_end": self.quiet_end, "skip_sundays": self.skip_sundays,
                "skip_holidays": self.skip_holidays, "state": self.state or None}


def _window_of(org: Any) -> Window:
    return Window(org.quiet_start, org.quiet_end, bool(org.skip_sundays), bool(org.skip_holidays), org.state or "")


def _posted_window(form: Mapping[str, Any], org: Any) -> Window:
    """The window from the POST, validated; problems land in `errors` keyed by field name."""
    win = Window(quiet_start=(form.get("quiet_start") or "").strip(), quiet_end=(form.get("quiet_end") or "").strip(),
                 skip_sundays="skip_sundays" in form, skip_holidays="skip_holidays" in form,
                 state=(form.get("state") or "").strip().upper())
    for name in ("quiet_start", "quiet_end"):
        if not _HHMM.match(getattr(win, name)):
            win.errors[name] = _("Horário inválido: use HH:MM, entre 00:00 e 23:59.")
    if not win.errors and parse_hhmm(win.quiet_start) >= parse_hhmm(win.quiet_end):
        win.errors["quiet_end"] = _("O fim do horário permitido deve ser depois do início.")
    if win.state and win.state not in dict(brazilian_states()):
        win.errors["state"] = _("Escolha um estado da lista.")
    if not win.errors:
        # The engine's own check (what populate and dispatch will build from these columns).
        try:
            window_policy(timezone=org.timezone, quiet_start=win.quiet_start, quiet_end=win.quiet_end,
                          skip_sundays=win.skip_sundays, skip_holidays=win.skip_holidays, state=win.state)
        except DomainError as exc:
            win.errors["quiet_start"] = _("Horário permitido inválido: %(error)s", error=str(exc))
    return win


def _posted_rule_ids(form: Mapping[str, Any]) -> list[int]:
    """Every rule id the POST names (the grid's hidden `rule` fields and the toggles' names);
    something that is not an id cannot be one of the org's rules: 404."""
    raw = list(form.getlist("rule")) if hasattr(form, "getlist") else []
    raw += [m.group(2) for m in map(_FIELD.match, form.keys()) if m]
    ids: list[int] = []
    for value in raw:
        if not _ID.match(str(value)):
            abort(404)
        if int(value) not in ids:
            ids.append(int(value))
    return ids


def _load_rows(conn: Connection, oid: int, ids: Sequence[int] | None = None, *, lock: bool = False) -> list[RuleRow]:
    """The org's rules (or those of `ids` among them) with their kinds in order."""
    r, rk = reminder_rules, reminder_rule_kinds
    query = select(r).where(r.c.org_id == oid).order_by(r.c.id)
    if ids is not None:
        query = query.where(r.c.id.in_(list(ids)))
    if lock:
        # Two people saving at once: the second reads the kinds the first wrote (PostgreSQL;
        # SQLite serialises writers anyway and ignores FOR UPDATE).
        query = query.with_for_update()
    rows = [RuleRow(id=int(x.id), name=x.name, purpose=x.purpose, trigger=x.trigger,
                    offset_minutes=int(x.offset_minutes or 0), respect_window=bool(x.respect_window),
                    active=bool(x.active), kinds=[]) for x in conn.execute(query)]
    by_id = {row.id: row for row in rows}
    if by_id:
        kinds = conn.execute(select(rk.c.rule_id, rk.c.kind).where(rk.c.org_id == oid, rk.c.rule_id.in_(list(by_id)))
                             .order_by(rk.c.rule_id, rk.c.position, rk.c.id))
        for k in kinds:
            by_id[int(k.rule_id)].kinds.append(k.kind)
    return rows


def _groups(rows: Sequence[RuleRow]) -> list[dict[str, Any]]:
    """Rules grouped by purpose (the known ones first, in their order), each group by when it sends."""
    purposes = list(RULE_PURPOSES) + sorted({r.purpose for r in rows} - set(RULE_PURPOSES))
    groups = []
    for purpose in purposes:
        members = [r for r in rows if r.purpose == purpose]
        if not members:
            continue
        # 24 h before comes before 2 h before: the order things happen to the patient.
        members.sort(key=lambda r: (_TRIGGER_ORDER.get(r.trigger, 9),
                                    -r.offset_minutes if r.trigger == "before_start" else r.offset_minutes, r.id))
        groups.append({"purpose": purpose, "title": GROUP_TITLES.get(purpose, PURPOSE_NAMES.get(purpose, purpose)),
                       "hint": GROUP_HINTS.get(purpose, ""), "rules": members})
    return groups


def _rule_kinds(view: Any, rule_id: int) -> list[str]:
    return [k.kind for k in view.session.query(ReminderRuleKind).filter(
        ReminderRuleKind.org_id == org_id(), ReminderRuleKind.rule_id == rule_id).order_by(ReminderRuleKind.position)]


def queue_message(change: QueueChange) -> str:
    """What a save did to the queue, exactly, in the clinic's words (skips are said, not hidden)."""
    if not change.changed:
        return _("Nenhum lembrete da fila mudou.")
    parts = [_("%(rescheduled)s, %(cancelled)s, %(created)s.",
               rescheduled=ngettext("%(num)d lembrete reagendado", "%(num)d lembretes reagendados", change.rescheduled),
               cancelled=ngettext("%(num)d cancelado", "%(num)d cancelados", change.cancelled),
               created=ngettext("%(num)d novo", "%(num)d novos", change.created))]
    if change.skipped:
        parts.append(ngettext("%(num)d lembrete não vai sair (tarde demais ou sem horário permitido antes da sessão); "
                              "o motivo aparece na Fila.",
                              "%(num)d lembretes não vão sair (tarde demais ou sem horário permitido antes da "
                              "sessão); o motivo aparece na Fila.", change.skipped))
    return " ".join(parts)


def _saved_message(change: QueueChange) -> str:
    return " ".join((_("Configurações salvas."), queue_message(change)))


# ------------------------------------------------------------------------------------------------
class ReminderRuleView(TenantModelView):
    """Reminder rules: the grid with the sending window at /admin/rules/, and per-rule forms
    (create, edit with the kinds' order as a comma list, details, CSV export)."""

    column_list = ("name", "purpose", "trigger", "offset_minutes", "kinds", "respect_window", "active")
    column_details_list = column_list + ("template_key", "created_at", "updated_at")
    column_export_list = column_list
    column_labels = {"name": _l("Nome"), "purpose": _l("Finalidade"), "trigger": _l("Gatilho"),
                     "offset_minutes": _l("Quando"), "kinds": _l("Canais (em ordem)"),
                     "respect_window": _l("Respeita horário permitido"), "active": _l("Ativa"),
                     "template_key": _l("Modelo"), "created_at": _l("Criada em"), "updated_at": _l("Atualizada em")}
    column_filters = ("active", "purpose", "trigger")
    column_formatters = {
        "kinds": lambda v, c, m, n: " → ".join(str(KIND_NAMES.get(k, k)) for k in _rule_kinds(v, m.id)),
        "purpose": lambda v, c, m, n: str(PURPOSE_NAMES.get(m.purpose, m.purpose)),
        "template_key": lambda v, c, m, n: str(PURPOSE_NAMES.get(m.template_key, m.template_key)),
        "trigger": lambda v, c, m, n: str(dict(TRIGGERS).get(m.trigger, m.trigger)),
        "offset_minutes": lambda v, c, m, n: timing_label(m.trigger, m.offset_minutes),
    }
    column_formatters_detail = column_formatters
    column_formatters_export = {"kinds": lambda v, c, m, n: ",".join(_rule_kinds(v, m.id)),
                                "offset_minutes": lambda v, c, m, n: m.offset_minutes}
    allow_delete = False
    empty_message = _l("Nenhuma regra. Crie a primeira (por exemplo, 24 horas antes por WhatsApp) para que os "
                       "agendamentos gerem lembretes.")
    audit_entity = "reminder_rules"
    list_template = "admin/rules_grid.html"

    # --- the grid ---------------------------------------------------------------------------
    @expose("/", methods=("GET", "POST"))
    def index_view(self) -> Any:
        """The grid and the sending window; a POST saves both (owner/manager only)."""
        if request.method == "POST":
            return self._save()
        conn = self.session.connection()
        org = conn.execute(select(orgs).where(orgs.c.id == org_id())).one()
        rows = _load_rows(conn, org_id())
        self.session.rollback()  # a read: end the transaction the connection began
        return self._render_grid(org, rows, _window_of(org))

    def _render_grid(self, org: Any, rows: list[RuleRow], window: Window, status: int = 200) -> Any:
        page = self.render(self.list_template, groups=_groups(rows), rules_count=len(rows), window=window,
                           org=org, states=brazilian_states(), kinds=GRID_KINDS, kind_names=KIND_NAMES,
                           editable=is_editor(), return_url=url_for(".index_view"))
        return page, status

    def _save(self) -> Any:
        # CSRF was checked by the app's CSRFProtect before this runs (a POST without it is a 400).
        if not is_editor():
            abort(403)
        oid = org_id()
        form = request.form
        ids = _posted_rule_ids(form)
        conn = self.session.connection()
        try:
            org = conn.execute(select(orgs).where(orgs.c.id == oid)).one()
            posted = _load_rows(conn, oid, ids, lock=True)
            if len(posted) != len(ids):
                abort(404)  # one of the ids is another org's rule (or none at all): touch nothing
            changes: list[tuple[RuleRow, bool, list[str]]] = []
            for row in posted:
                turned_on = form.getlist(f"kind-{row.id}")
                if any(k not in CHANNEL_KINDS for k in turned_on):
                    abort(400)
                kinds = toggled_kinds(row.kinds, turned_on)
                active = f"active-{row.id}" in form
                # No channel at all is refused rather than read as "switch the rule off": turning
                # a rule off is what "Ativa" is for, and a refusal that says so is clearer to a
                # receptionist than a rule that silently changes state (and loses its order).
                # Every rule keeps at least one kind, as the edit form requires too. A rule stored
                # without any (written outside the console) that stays off is left alone: refusing
                # it would block saving the rest of the page over a row nobody touched.
                if not kinds and (row.kinds or active):
                    row.error = _("Marque ao menos um canal. Para parar de enviar esta regra, desmarque “Ativa”.")
                changes.append((row, active, kinds))
            window = _posted_window(form, org)
            if window.errors or any(row.error for row, _a, _k in changes):
                self.session.rollback()
                shown = {row.id: row for row in _load_rows(self.session.connection(), oid)}
                for row, active, kinds in changes:  # show what was posted, not what is saved
                    shown[row.id] = RuleRow(**{**row.__dict__, "active": active, "kinds": kinds})
                self.session.rollback()
                flash(_("Nada foi salvo: corrija os campos marcados abaixo."), "error")
                return self._render_grid(org, list(shown.values()), window, 200)
            window_changed = self._window_changed(org, window)
            touched = self._apply(conn, oid, org, changes, window)
            result = (reflect_rule_changes(conn, oid, touched, runtime().settings.populate_horizon,
                                           window_changed=window_changed)
                      if touched or window_changed else None)
            self.session.commit()
        except BaseException:
            self.session.rollback()
            raise
        if result is None:
            flash(_("Nada mudou: as configurações já estavam assim."), "info")
        else:
            flash(_saved_message(result), "success")
        return redirect(url_for(".index_view"))

    @staticmethod
    def _window_changed(org: Any, window: Window) -> bool:
        return any(getattr(org, k) != v for k, v in window.values().items())

    def _apply(self, conn: Connection, oid: int, org: Any, changes: Sequence[tuple[RuleRow, bool, list[str]]],
               window: Window) -> list[int]:
        """Write the rules and the window with their audit rows; returns the ids of rules changed."""
        now = clock.now()
        touched: list[int] = []
        for row, active, kinds in changes:
            changed = False
            if active != row.active:
                conn.execute(update(reminder_rules).where(reminder_rules.c.org_id == oid, reminder_rules.c.id == row.id)
                             .values(active=active, updated_at=now))
                write_audit(conn, "update", "reminder_rules", row.id, {"active": active})
                changed = True
            if kinds != row.kinds:
                write_rule_kinds(conn, oid, row.id, kinds)
                if not changed:
                    conn.execute(update(reminder_rules).where(reminder_rules.c.org_id == oid,
                                                              reminder_rules.c.id == row.id).values(updated_at=now))
                write_audit(conn, "update", "reminder_rule_kinds", row.id, {"kinds": kinds})
                changed = True
            if changed:
                touched.append(row.id)
        diff = {k: v for k, v in window.values().items() if getattr(org, k) != v}
        if diff:
            conn.execute(update(orgs).where(orgs.c.id == oid).values(**diff, updated_at=now))
            write_audit(conn, "update", "orgs", oid, diff)
        return touched

    # --- the per-rule forms ------------------------------------------------------------------
    def scaffold_form(self) -> Any:
        purposes = select_choices((k, PURPOSE_NAMES[k]) for k in RULE_PURPOSES)

        class RuleForm(self.form_base_class):  # type: ignore[name-defined,misc]
            name = StringField(_l("Nome"), validators=[DataRequired(message=_l("Dê um nome à regra.")),
                                                       Length(max=200)])
            purpose = SelectField(_l("Finalidade"), choices=purposes)
            template_key = SelectField(_l("Modelo"), choices=purposes)
            trigger = SelectField(_l("Gatilho"), choices=select_choices(TRIGGERS))
            offset_minutes = IntegerField(_l("Antecedência (minutos)"), default=1440,
                                          validators=[NumberRange(min=0, max=60 * 24 * 60,
                                                                  message=_l("Entre 0 e 86400."))])
            kinds = StringField(_l("Canais, em ordem de preferência"), default="whatsapp",
                                description=_l("Separados por vírgula: whatsapp, sms, email. Usa o primeiro que o "
                                               "paciente aceitou e que a clínica tem configurado; se ele falhar, "
                                               "tenta o próximo."))
            respect_window = BooleanField(_l("Respeitar horário permitido, domingos e feriados"), default=True)
            active = BooleanField(_l("Ativa"), default=True)

            def validate_kinds(self, field: Any) -> None:
                parse_kinds(field.data)
        return RuleForm

    def on_form_prefill(self, form: Any, id: Any) -> None:
        form.kinds.data = ", ".join(_rule_kinds(self, int(id)))

    def on_model_change(self, form: Any, model: Any, is_created: bool) -> None:
        kinds = parse_kinds(form.kinds.data)
        super().on_model_change(form, model, is_created)  # flushes, audits
        conn = self.session.connection()
        if _rule_kinds(self, model.id) != kinds:
            write_rule_kinds(conn, org_id(), model.id, kinds)
            write_audit(conn, "update", "reminder_rule_kinds", model.id, {"kinds": kinds})
        # Same transaction as the rule: the queue reflects it when the form's save commits; the
        # message waits for the commit (after_model_change), so it never tells of a rolled-back save.
        g.lembra_queue_change = reflect_rule_changes(conn, org_id(), [model.id], runtime().settings.populate_horizon)

    def after_model_change(self, form: Any, model: Any, is_created: bool) -> None:
        change = g.pop("lembra_queue_change", None)
        if change is not None:
            flash(queue_message(change), "success")
