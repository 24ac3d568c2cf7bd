"""Typed Flask-Admin filters (issue 9, point 8).

Flask-Admin hands a filter the query string's text. Compared as is with an integer column it
fails on PostgreSQL (`bigint = varchar`), and a naive date-time is refused by the UTC column type
(engine.store.db.UTCDateTime), so every filter of the console converts and validates its value first:
a value it cannot take is ignored, and the list says so (TenantModelView._get_list_filter_args),
instead of answering 500.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from flask_admin.contrib.sqla.filters import DateTimeBetweenFilter, FilterEqual
from sqlalchemy import Unicode, and_, cast, or_

from admin.i18n import _
from admin.ids import parse_id


class IdEqualFilter(FilterEqual):
    """`column = <id>` for an id column (a foreign key such as messages.channel_id): the value is
    an int in the range of a bigint identity, anything else is not valid (and so ignored)."""

    def clean(self, value: Any) -> int:
        number = parse_id(value)
        if number is None:
            raise ValueError("not an id")
        return number


class OrgDateTimeBetweenFilter(DateTimeBetweenFilter):
    """"between two date-times" typed in the clinic's time zone (the one the lists show), compared
    as aware instants; a range that is not two date-times in order, or that leaves the calendar
    once in UTC (9999-12-31 23:59 in São Paulo), is not valid."""

    def clean(self, value: Any) -> list[datetime]:
        from admin.views.base import org_timezone

        tz = ZoneInfo(org_timezone())
        try:
            bounds = [naive.replace(tzinfo=tz).astimezone(UTC) for naive in super().clean(value)]
        except OverflowError:
            raise ValueError("date out of range") from None
        if len(bounds) != 2 or bounds[0] > bounds[1]:
            raise ValueError("not a range")
        return bounds

    def validate(self, value: Any) -> bool:
        try:
            self.clean(value)
        except (ValueError, TypeError):
            return False
        return True


class PatientSearchMixin:
    """The list's search box also finds rows by their patient's name or phone (any spelling:
    "(16) 99988-7766" finds "+5516999887766"), through engine.people.contacts.matching, scoped to the
    signed-in org. Goes before TenantModelView in the bases; `patient_column` names the row's
    contact id column (`id` for the contacts list itself)."""

    patient_column = "contact_id"

    def init_search(self) -> bool:
        super().init_search()  # type: ignore[misc]
        self._search_fields = getattr(self, "_search_fields", None) or []
        return True

    def search_placeholder(self) -> str:
        own = super().search_placeholder()  # type: ignore[misc]
        patient = _("paciente (nome ou telefone)")
        return f"{patient}, {own}" if own else patient

    def _apply_search(self, query: Any, count_query: Any, joins: Any, count_joins: Any, search: str) -> Any:
        from admin.views.base import org_id
        from engine.people.contacts import matching

        words = [w for w in search.split() if w]
        if not words:
            return query, count_query, joins, count_joins
        # Flask-Admin's own rule for the view's columns: every word in one of them.
        own = [or_(*(cast(column, Unicode).ilike(f"%{word}%") for column, _path in self._search_fields))
               for word in words] if self._search_fields else []
        patient = getattr(self.model, self.patient_column).in_(matching(org_id(), search))  # type: ignore[attr-defined]
        clause = or_(and_(*own), patient) if own else patient
        query = query.filter(clause)
        if count_query is not None:
            count_query = count_query.filter(clause)
        return query, count_query, joins, count_joins
