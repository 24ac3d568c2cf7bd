"""Bad input never answers 500 (issue 9, point 8): filters are typed (an integer column is never
compared with a string; a value that is not one answers the list with a pt-BR message and the
filter ignored), and ids that no row can have (beyond bigint, negative, zero, not a number) answer
404 on every details, edit, delete, action and custom page of the console, on both backends."""

from __future__ import annotations

import re

import pytest
from flask_admin.contrib.sqla.filters import BaseSQLAFilter
from flask_admin.contrib.sqla.view import ModelView
from sqlalchemy import BigInteger, Integer, update

from admin.ids import MAX_ID, parse_id, valid_id
from engine.core import clock as engine_clock
from engine.store.models import messages
from tests.admin.conftest import csrf

#: Ids no row can have: one past bigint, far past it, negative, zero, and things that are not ids.
BAD_IDS = ("9223372036854775808", "99999999999999999999", "-1", "0", "abc", "1.5", "²", "1e3", " 1", "")
#: Filter values that are not an id of anything.
BAD_VALUES = ("abc", "9223372036854775808", "99999999999999999999", "-1", "1.5", "²", "")


def _model_views(app) -> list[ModelView]:
    return [v for v in app.extensions["admin"][0]._views if isinstance(v, ModelView)]


def _is_integer(flt: BaseSQLAFilter) -> bool:
    column = getattr(flt, "column", None)
    col_type = getattr(column, "type", None)
    return isinstance(col_type, (Integer, BigInteger)) or any(
        isinstance(v, (Integer, BigInteger)) for v in getattr(col_type, "_variant_mapping", {}).values())


def test_valid_id_is_the_range_of_a_bigint_identity():
    assert MAX_ID == 2**63 - 1
    for good in (1, "1", "42", str(MAX_ID), MAX_ID):
        assert valid_id(good), good
        assert parse_id(good) == int(good)
    for bad in (*BAD_IDS, None, 0, -1, MAX_ID + 1, True, 1.0, "٣", "0x10", "+1", "1_000", "00000000000000000001" * 2):
        assert not valid_id(bad), bad
        assert parse_id(bad) is None


def test_every_integer_filter_of_every_view_is_typed(app):
    """No view compares an integer column with the query string's text (PostgreSQL: bigint = varchar)."""
    found = 0
    for view in _model_views(app):
        for flt in view._filters or ():
            if not isinstance(flt, BaseSQLAFilter) or not _is_integer(flt):
                continue
            found += 1
            assert flt.clean("12") == 12, (view.endpoint, flt.name)
            for value in BAD_VALUES:
                assert not flt.validate(value), (view.endpoint, flt.name, value)
    assert found >= 1  # Registros' channel filter at least


def _sent(rt, message_id: int, channel_id: int) -> None:
    with rt.db.begin() as conn:
        conn.execute(update(messages).where(messages.c.id == message_id)
                     .values(status="sent", channel_id=channel_id, sent_at=engine_clock.now()))


def _row_ids(page) -> set[int]:
    return {int(i) for i in re.findall(r"details/\?id=(\d+)", page.text.replace("&amp;", "&"))}


def test_logs_channel_filter_by_id(rt, owner, tenants):
    a, b = tenants
    _sent(rt, a.message_id, a.channel_id)
    _sent(rt, b.message_id, b.channel_id)
    assert _row_ids(owner.get("/admin/logs/")) == {a.message_id}
    mine = owner.get(f"/admin/logs/?flt0_0={a.channel_id}")
    assert mine.status_code == 200 and _row_ids(mine) == {a.message_id}
    other = owner.get(f"/admin/logs/?flt0_0={b.channel_id}")  # another org's channel: nothing
    assert other.status_code == 200 and _row_ids(other) == set()
    for value in BAD_VALUES:
        response = owner.get("/admin/logs/", query_string={"flt0_0": value})
        assert response.status_code == 200, value
        # Ignored, and said so in Portuguese: the list is the unfiltered one.
        assert "Filtro ignorado" in response.text, value
        assert _row_ids(response) == {a.message_id}, value


def test_every_filter_of_every_view_takes_any_value_without_a_500(app, owner, tenants):
    """Every filter of every list (and its CSV export) with hostile values: a page, never a 500."""
    values = (*BAD_VALUES, "1", "2026-12-01 00:00:00 to 2026-12-02 00:00:00", "2026-12-01 to 2026-12-02",
              "2026-12-01 00:00:00", "2026-12-02 00:00:00 to 2026-12-01 00:00:00", "0001-01-01 00:00:00 to 0001-01-01 01:00:00",
              "2026-13-45 99:99:99 to x", "9999-12-31 23:59:59 to 9999-12-31 23:59:59", "\x00", "' OR 1=1 --")
    for view in _model_views(app):
        keys = list(view._filter_args or {})
        for value in values:
            # Every filter of the view at once (each one a value cannot go to is left out on its own).
            query = {f"flt{pos}_{key}": value for pos, key in enumerate(keys)}
            for suffix in ("", "export/csv/") if value in values[:3] else ("",):
                url = f"/admin/{view.endpoint}/{suffix}"
                response = owner.get(url, query_string=query)
                assert response.status_code in (200, 302), (url, value, response.status_code)


@pytest.mark.parametrize("value", ("-1", "99999999999999999999", "abc", "9223372036854775808"))
def test_list_paging_and_sorting_take_any_value(app, owner, tenants, value):
    for view in _model_views(app):
        for arg in ("page", "sort", "desc", "page_size", "search"):
            response = owner.get(f"/admin/{view.endpoint}/", query_string={arg: value})
            assert response.status_code in (200, 302), (view.endpoint, arg, value, response.status_code)
        for search in ("\x00", "a\x00b"):
            response = owner.get(f"/admin/{view.endpoint}/", query_string={"search": search})
            assert response.status_code in (200, 302), (view.endpoint, arg, value, response.status_code)


def test_ids_no_row_can_have_answer_404_on_every_page(app, owner, tenants):
    token = csrf(owner.get("/admin/contacts/").text)
    for view in _model_views(app):
        base = f"/admin/{view.endpoint}"
        for bad in BAD_IDS:
            for method, url, data in (
                ("get", f"{base}/details/", None),
                ("get", f"{base}/edit/", None),
                ("post", f"{base}/edit/", {"csrf_token": token, "name": "x"}),
            ):
                response = getattr(owner, method)(url, query_string={"id": bad}, data=data)
                assert response.status_code in (404, 302), (method, url, bad, response.status_code)
            delete = owner.post(f"{base}/delete/", data={"csrf_token": token, "id": bad})
            assert delete.status_code in (404, 302), (base, "delete", bad, delete.status_code)
            for name, _text in view._actions or ():
                action = owner.post(f"{base}/action/", data={"csrf_token": token, "action": name, "rowid": [bad]})
                assert action.status_code in (200, 302, 404), (base, name, bad, action.status_code)


CUSTOM_PAGES = (
    ("post", "/admin/inbox/resolve/{}/"),
    ("post", "/admin/apikeys/revoke/{}/"),
    ("post", "/admin/channels/test/{}/"),
    ("get", "/admin/channels/connect/{}/"),
    ("post", "/admin/channels/connect/{}/"),
    ("get", "/admin/channels/connect/{}/state"),
)


def test_ids_no_row_can_have_answer_404_on_the_custom_pages(owner, tenants):
    token = csrf(owner.get("/admin/contacts/").text)
    for bad in ("9223372036854775808", "99999999999999999999", "0", "-1"):
        for method, pattern in CUSTOM_PAGES:
            response = getattr(owner, method)(pattern.format(bad), data={"csrf_token": token, "to": "x"})
            assert response.status_code == 404, (pattern, bad, response.status_code)


def test_sandbox_ids_no_row_can_have_answer_404(owner, tenants):
    token = csrf(owner.get("/admin/contacts/").text)
    for bad in ("9223372036854775808", "99999999999999999999", "0", "²"):
        assert owner.get("/admin/sandbox/", query_string={"contact": bad}).status_code == 404, bad
        reply = owner.post("/admin/sandbox/reply/", data={"csrf_token": token, "sandbox_message_id": bad,
                                                          "text": "OK"})
        assert reply.status_code == 404, bad

