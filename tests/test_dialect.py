"""engine.store.dialect: the statements spelled per backend give the same rows on both, and on
PostgreSQL keep one statement text whatever the number of values (so it is compiled and
prepared once)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.exc import StatementError

from engine.store.dialect import in_pairs, in_values, insert_rows, update_per_row
from engine.store.models import contacts, message_events
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


def test_in_pairs_finds_the_pairs_not_every_combination(rt: Any) -> None:
    clinic, other = World(rt), World(rt, slug="outra")
    mine = clinic.contact(name="Ana", phone="+5516999887701")
    also_mine = clinic.contact(name="Bia", phone="+5516999887702")
    theirs = other.contact(name="Caio", phone="+5516999887702")
    seen, remember = _texts(rt)
    try:
        with rt.db.connect() as conn:
            def found(columns: Any, pairs: Any) -> list[int]:
                return sorted(conn.execute(select(contacts.c.id).where(in_pairs(conn, columns, pairs))).scalars())

            # (clinic, …702) is a combination of the asked orgs and phones, not an asked pair.
            by_phone = found((contacts.c.org_id, contacts.c.phone),
                             [(clinic.org_id, "+5516999887701"), (other.org_id, "+5516999887702")])
            by_id = [found((contacts.c.org_id, contacts.c.id), pairs) for pairs in (
                [(clinic.org_id, mine)], [(clinic.org_id, mine), (other.org_id, theirs), (other.org_id, also_mine)])]
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", remember)
    assert by_phone == sorted([mine, theirs])
    assert by_id == [[mine], sorted([mine, theirs])]
    if rt.db.engine.dialect.name == "postgresql":
        assert len(set(seen[1:])) == 1  # one text for any number of pairs


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


def test_update_per_row_holds_each_row_to_its_own_matched_value(rt: Any, clock: Any) -> None:
    """`match` columns are compared, never written: a row named with another org's id is left
    alone (and keeps its org), the others change."""
    clinic, other = World(rt), World(rt, slug="outra")
    mine = clinic.contact(name="Minha", phone="+5516999887720")
    theirs = other.contact(name="Dela", phone="+5516999887721")
    with rt.db.begin() as conn:
        rows = update_per_row(
            conn, contacts, {mine: {"org_id": clinic.org_id, "name": "Mudou"},
                             theirs: {"org_id": clinic.org_id, "name": "Não devia"}},
            match=("org_id",), where=[], values={"updated_at": clock.now()}, returning=[contacts.c.id])
    assert [row.id for row in rows] == [mine]
    with rt.db.connect() as conn:
        found = {row.id: (row.org_id, row.name) for row in conn.execute(
            select(contacts.c.id, contacts.c.org_id, contacts.c.name).where(contacts.c.id.in_([mine, theirs])))}
    assert found == {mine: (clinic.org_id, "Mudou"), theirs: (other.org_id, "Dela")}


def test_in_values_keeps_texts_whole(rt: Any) -> None:
    # Values that an array literal would have to quote: commas, braces, quotes, backslashes.
    clinic = World(rt)
    odd = ['Ana, "a" {x}', "Bia \\ barra", "Cé", "NULL"]
    ids = {clinic.contact(name=name, phone=f"+551699988772{i}"): name for i, name in enumerate(odd)}
    with rt.db.connect() as conn:
        found = conn.execute(select(contacts.c.id).where(contacts.c.org_id == clinic.org_id,
                                                         in_values(conn, contacts.c.name, odd[:2] + ["NULL"]))).scalars()
        assert sorted(found) == sorted(cid for cid, name in ids.items() if name in (odd[0], odd[1], "NULL"))


def _a_message(rt: Any, clock: Any) -> tuple[World, int]:
    clinic = World(rt)
    clinic.channel()
    clinic.rule(offset_minutes=60)
    clinic.appointment(clinic.contact(), clock.now() + timedelta(days=2))
    clinic.populate()
    return clinic, clinic.messages()[0].id


def test_insert_rows_writes_every_value_as_given(rt: Any, clock: Any) -> None:
    clinic, mid = _a_message(rt, clock)
    brt = timezone(timedelta(hours=-3))
    rows = [
        {"org_id": clinic.org_id, "message_id": mid, "event": "note", "attempt": 1,
         "provider_status": 'aspas "duplas", barra \\ e {chaves}', "created_at": datetime(2026, 3, 21, 14, 0, tzinfo=brt),
         "detail": {"reason": "pacing", "slot": "2026-03-21T17:00:00+00:00", "n": [1, 2], "ok": True}},
        {"org_id": clinic.org_id, "message_id": mid, "event": "note", "attempt": 2,
         "provider_status": None, "created_at": datetime(2026, 3, 21, 17, 0, 0, 123456, tzinfo=timezone.utc),
         "detail": None},
        {"org_id": clinic.org_id, "message_id": mid, "event": "note", "attempt": 3,
         "provider_status": "çãé ✓", "created_at": datetime(2026, 3, 21, 17, 0, tzinfo=timezone.utc),
         "detail": {}},
    ]
    seen, remember = _texts(rt)
    try:
        with rt.db.begin() as conn:
            insert_rows(conn, message_events, rows[:1])
            insert_rows(conn, message_events, rows[1:])
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", remember)
    e = message_events.c
    with rt.db.connect() as conn:
        written = conn.execute(select(e.org_id, e.message_id, e.event, e.attempt, e.provider_status, e.created_at,
                                      e.detail).where(e.org_id == clinic.org_id, e.event == "note")
                               .order_by(e.attempt)).all()
    assert [row._asdict() for row in written] == rows
    # None goes in as JSON null on both backends, as SQLAlchemy's own inserts write it.
    with rt.db.connect() as conn:
        nulls = conn.execute(select(e.attempt).where(e.org_id == clinic.org_id, e.event == "note",
                                                     e.detail.is_(None))).scalars().all()
    assert nulls == []
    if rt.db.engine.dialect.name == "postgresql":
        assert len(set(seen)) == 1


def test_insert_rows_refuses_a_naive_timestamp_and_writes_none_of_the_batch(rt: Any, clock: Any) -> None:
    clinic, mid = _a_message(rt, clock)
    good = {"org_id": clinic.org_id, "message_id": mid, "event": "note", "attempt": 1, "provider_status": None,
            "created_at": clock.now(), "detail": None}
    naive = {**good, "attempt": 2, "created_at": datetime(2026, 3, 21, 17, 0)}
    # SQLAlchemy wraps the type's ValueError on SQLite; PostgreSQL's JSON path raises it as is.
    with pytest.raises((ValueError, StatementError), match="naive datetime"):
        with rt.db.begin() as conn:
            insert_rows(conn, message_events, [good, naive])
    assert "note" not in clinic.events(mid)
