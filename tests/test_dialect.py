"""engine.dialect: the statements spelled per backend give the same rows on both, and on
PostgreSQL keep one statement text whatever the number of values (so it is compiled and
prepared once)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select

from engine.dialect import in_values, update_per_row
from engine.models import contacts
from tests.factories import World


def _texts(rt: Any) -> tuple[list[str], Any]:
    seen: list[str] = []

    def remember(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(rt.db.engine, "before_cursor_execute", remember)
    return seen, remember


def test_in_values_finds_the_same_rows_with_one_statement_text(rt: Any) -> None:
    clinic, other = World(rt), World(rt, slug="outra")
    ids = [clinic.contact(name=f"Pessoa {i}", phone=f"+551699988770{i}") for i in range(4)]
    foreign = other.contact(name="Outra", phone="+5516999887799")
    seen, remember = _texts(rt)
    try:
        with rt.db.connect() as conn:
            found = []
            # No values find nothing, on either backend.
            for wanted in (ids[:1], ids[:3], [*ids, foreign], []):
                query = select(contacts.c.id).where(contacts.c.org_id == clinic.org_id,
                                                    in_values(conn, contacts.c.id, wanted))
                found.append(sorted(conn.execute(query).scalars()))
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", remember)
    # The foreign id among the values stays out through the query's own org filter; in_values must
    # not widen it.
    assert found == [ids[:1], ids[:3], ids, []]
    if rt.db.engine.dialect.name == "postgresql":
        assert len(set(seen)) == 1
        assert "= ANY" in seen[0]


def test_update_per_row_has_one_statement_text_for_any_batch(rt: Any, clock: Any) -> None:
    clinic = World(rt)
    ids = [clinic.contact(name=f"Pessoa {i}", phone=f"+551699988771{i}") for i in range(3)]
    seen, remember = _texts(rt)
    try:
        with rt.db.begin() as conn:
            for batch in (ids[:1], ids):
                rows = update_per_row(
                    conn, contacts, {cid: {"name": f"Nome {cid}"} for cid in batch},
                    where=[contacts.c.org_id == clinic.org_id], values={"updated_at": clock.now()},
                    returning=[contacts.c.id])
                assert sorted(row.id for row in rows) == batch
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", remember)
    with rt.db.connect() as conn:
        names = dict(conn.execute(select(contacts.c.id, contacts.c.name).where(contacts.c.id.in_(ids))).all())
    assert names == {cid: f"Nome {cid}" for cid in ids}
    if rt.db.engine.dialect.name == "postgresql":
        assert len(set(seen)) == 1
