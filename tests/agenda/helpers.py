"""What the agenda tests share: a clinic with professionals on a weekday week with a lunch break."""

from __future__ import annotations

from typing import Any

from engine.people.agenda import Professional, create_professional, org_row

#: Monday to Friday, 08:00–12:00 and 13:00–18:00.
WEEK = [{"weekday": d, "starts": s, "ends": e} for d in range(5) for s, e in (("08:00", "12:00"), ("13:00", "18:00"))]


def professional(rt: Any, org_id: int, name: str = "Dra. Beatriz Costa", hours: Any = None, **kwargs: Any
                 ) -> Professional:
    with rt.db.begin() as conn:
        return create_professional(conn, org_id, name=name, hours=WEEK if hours is None else hours, **kwargs)


def org_of(rt: Any, org_id: int) -> Any:
    with rt.db.connect() as conn:
        return org_row(conn, org_id)


def hhmm(slots: Any) -> list[str]:
    """Each slot as 'MM-DD HH:MM' in its own (the org's) timezone."""
    return [s.starts_at.strftime("%m-%d %H:%M") for s in slots]
