"""Agenda: the built-in agenda's professionals (engine/people/agenda/), their weekly hours, breaks and
slot length, and the next free times each one has, as a flow's `offer_slots` would offer them.

A day's hours are typed as intervals, "08:00-12:00, 13:00-18:00": the gap between two intervals is
the break. The engine checks a save whole (times, order, overlaps, slot length, a taken name) and
refuses it with one finding, shown on its input in the catalogue's words; nothing is written then.
The free times come from `engine.people.agenda.free_slots`, the function the flows use. Owners and
managers only; another org's professional is a 404.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from flask import abort, flash, redirect, request, url_for
from flask_admin import expose

from admin.i18n import _, _l, translate
from admin.views.base import db_session, local_dt, org_id, write_audit
from admin.views.settings.gated import AdminPageView, path_id
from engine.core import clock
from engine.people import agenda
from engine.people.agenda.professionals import DEFAULT_SLOT_MINUTES, Interval

#: Monday first, as the engine numbers the days (0 = Monday).
WEEKDAYS = (_l("Segunda"), _l("Terça"), _l("Quarta"), _l("Quinta"), _l("Sexta"), _l("Sábado"), _l("Domingo"))
#: Free times shown per professional.
NEXT_SLOTS = 5
_PIECE = re.compile(r"^\s*(\S+)\s*[-–]\s*(\S+)\s*$")


class DayError(Exception):
    """A day's text that is not a list of intervals; `weekday` says which day."""

    def __init__(self, weekday: int) -> None:
        super().__init__(weekday)
        self.weekday = weekday


def parse_week(form: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The week's intervals from the form's `day-0` … `day-6` ("08:00-12:00, 13:00-18:00"), in the
    engine's shape; a piece that is not "start-end" raises DayError (the engine checks the times)."""
    hours: list[dict[str, Any]] = []
    for weekday in range(7):
        text = (form.get(f"day-{weekday}") or "").strip()
        for piece in filter(None, (p.strip() for p in re.split(r"[,;\n]", text))):
            match = _PIECE.match(piece)
            if match is None:
                raise DayError(weekday)
            hours.append({"weekday": weekday, "starts": match.group(1), "ends": match.group(2)})
    return hours


def day_texts(hours: Sequence[Interval]) -> list[str]:
    """The week as the form shows it, one text per weekday."""
    return [", ".join(f"{i.starts}-{i.ends}" for i in hours if i.weekday == day) for day in range(7)]


def _where(field: str, hours: Sequence[Mapping[str, Any]]) -> str:
    """The form input an engine finding is about (`hours.3.ends` is the day of the 4th interval)."""
    if field.startswith("hours."):
        index = int(field.split(".")[1])
        return f"day-{hours[index]['weekday']}" if index < len(hours) else "hours"
    return field if field in ("name", "slot_minutes") else "hours"


def _slot_minutes(raw: str) -> Any:
    text = (raw or "").strip()
    return int(text) if text.isdigit() and len(text) <= 4 else text  # the engine refuses what is not a number


class AgendaView(AdminPageView):
    """Agenda (endpoint `settings_agenda`, /admin/settings/agenda/)."""

    @expose("/")
    def index(self) -> Any:
        """Every professional with their week and next free times."""
        session = db_session()
        conn = session.connection()
        oid = org_id()
        org = agenda.org_row(conn, oid)
        rows = []
        for pro in agenda.list_professionals(conn, oid):
            slots: list[str] = []
            if pro.active and not org.availability_url:
                query = agenda.SlotQuery(professional_id=pro.id, limit=NEXT_SLOTS)
                slots = [local_dt(s.starts_at) for s in agenda.free_slots(conn, org, query, clock.now())]
            rows.append({"pro": pro, "days": day_texts(pro.hours), "slots": slots})
        session.rollback()
        return self.render("admin/settings/agenda.html", rows=rows, weekdays=WEEKDAYS,
                           external=bool(org.availability_url))

    @expose("/new/", methods=("GET", "POST"))
    def create(self) -> Any:
        """A new professional; a POST saves it whole or shows what to fix."""
        values = {"name": "", "slot_minutes": str(DEFAULT_SLOT_MINUTES), "active": True,
                  "days": [""] * 7}
        errors: dict[str, str] = {}
        if request.method == "POST":
            values, errors = self._save(None)
            if not errors:
                return redirect(url_for(".index"))
        return self._form(values, errors, None)

    @expose("/<int:professional_id>/edit/", methods=("GET", "POST"))
    def edit(self, professional_id: int) -> Any:
        """One professional's name, slot length, active switch and week."""
        professional_id = path_id(professional_id)
        session = db_session()
        try:
            pro = agenda.get_professional(session.connection(), org_id(), professional_id)
        except agenda.ProfessionalNotFound:
            abort(404)
        if request.method == "POST":
            values, errors = self._save(pro)
            if not errors:
                return redirect(url_for(".index"))
        else:
            session.rollback()
            values = {"name": pro.name, "slot_minutes": str(pro.slot_minutes), "active": pro.active,
                      "days": day_texts(pro.hours)}
            errors = {}
        return self._form(values, errors, professional_id)

    def _save(self, pro: agenda.Professional | None) -> tuple[dict[str, Any], dict[str, str]]:
        """Write the POST through the engine; (what was posted, errors by input) — none when saved."""
        form = request.form
        values = {"name": form.get("name", ""), "slot_minutes": form.get("slot_minutes", ""),
                  "active": "active" in form, "days": [form.get(f"day-{d}", "") for d in range(7)]}
        session = db_session()
        conn = session.connection()
        oid = org_id()
        try:
            hours = parse_week(form)
        except DayError as exc:
            session.rollback()
            return values, {f"day-{exc.weekday}": translate(agenda.AgendaError("agenda_time").text)}
        data = {"name": values["name"], "slot_minutes": _slot_minutes(values["slot_minutes"]),
                "active": values["active"], "hours": hours}
        try:
            if pro is None:
                saved = agenda.create_professional(conn, oid, **data)
            else:
                saved = agenda.update_professional(conn, oid, pro.id, **data)
        except agenda.AgendaError as exc:
            session.rollback()
            return values, {_where(exc.field, hours): translate(exc.text)}
        write_audit(conn, "create" if pro is None else "update", "professionals", saved.id, saved.as_json())
        session.commit()
        flash(_("Agenda de “%(nome)s” salva.", nome=saved.name), "success")
        return values, {}

    def _form(self, values: Mapping[str, Any], errors: Mapping[str, str], professional_id: int | None) -> Any:
        return self.render("admin/settings/agenda_form.html", values=values, errors=errors, weekdays=WEEKDAYS,
                           professional_id=professional_id)
