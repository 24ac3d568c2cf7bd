"""Painel: one title; each message counted once, by its furthest state, on the day it was sent (or
failed); the per-channel table says what it counts; the alerts."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

from sqlalchemy import update

from admin.views.desk import dashboard
from admin.views.desk.dashboard import furthest_state, tally
from engine.core import clock as engine_clock
from engine.store.models import messages

TZ = ZoneInfo("America/Sao_Paulo")


def _set(rt, message_id: int, **values) -> None:
    with rt.db.begin() as conn:
        conn.execute(update(messages).where(messages.c.id == message_id).values(**values))


def _headings(html: str) -> list[str]:
    return [re.sub(r"<[^>]+>|\s+", " ", h).strip() for h in re.findall(r"<h[1-4][^>]*>(.*?)</h[1-4]>", html, re.DOTALL)]


def _segments(html: str) -> list[tuple[str, float]]:
    return [(kind, float(px)) for kind, px in re.findall(r'<div class="seg-(\w+)" style="height:([\d.]+)px">', html)]


def test_the_title_appears_once(owner, tenants):
    page = owner.get("/admin/").get_data(as_text=True)
    headings = _headings(page)
    assert [h for h in headings if "Painel" in h] == ["Painel da Clínica Clinica-A"]
    assert page.count("Painel da Clínica Clinica-A") == 1


def test_a_delivered_and_read_message_is_one_unit_of_one_bar(owner, tenants, rt):
    a, _ = tenants
    now = engine_clock.now()
    _set(rt, a.message_id, status="read", sent_at=now - timedelta(hours=3), delivered_at=now - timedelta(hours=2),
         read_at=now - timedelta(hours=1))
    page = owner.get("/admin/").get_data(as_text=True)
    assert _segments(page) == [("read", 150.0)]  # one message, the full height, in one segment
    assert re.findall(r'data-total="(\d+)"', page).count("1") == 1
    assert set(re.findall(r'data-total="(\d+)"', page)) == {"0", "1"}
    assert ("mensagens: 1; lidas: 1; entregues, não lidas: 0; sem confirmação de entrega: 0; falharam: 0"
            in page)  # the bar's tooltip
    # the per-channel table: one message, in the "Lidas" column only; the headers say what they count
    header = re.search(r"<thead>(.*?)</thead>", page, re.DOTALL).group(1)
    assert re.findall(r"<th>(.*?)</th>", header) == ["Canal", "Mensagens (total)", "Lidas", "Entregues, não lidas",
                                                     "Enviadas, sem confirmação de entrega", "Falharam"]
    row = re.search(r"<tbody>(.*?)</tbody>", page, re.DOTALL).group(1)
    assert re.findall(r"<td>(.*?)</td>", row) == ["WhatsApp", "1", "1", "0", "0", "0"]


def test_bars_stack_each_message_once_and_scale_to_the_busiest_day(owner, tenants, rt):
    a, _ = tenants
    now = engine_clock.now()
    today = now - timedelta(hours=2)
    # today: the tenant's reminder only sent; two more, one delivered, one failed after it was sent
    _set(rt, a.message_id, status="sent", sent_at=today)
    contact = a.world.contact(name="Outra", phone="+5516999001100")
    a.world.appointment(contact, now + timedelta(hours=6))
    a.world.appointment(contact, now + timedelta(hours=7))
    others = [m.id for m in a.world.messages() if m.id != a.message_id][:2]
    assert len(others) == 2
    _set(rt, others[0], status="delivered", sent_at=today, delivered_at=today + timedelta(minutes=1))
    _set(rt, others[1], status="failed", sent_at=today, failed_at=today + timedelta(minutes=1))
    page = owner.get("/admin/").get_data(as_text=True)
    assert sorted(_segments(page)) == [("delivered", 50.0), ("failed", 50.0), ("sent", 50.0)]
    row = re.search(r"<tbody>(.*?)</tbody>", page, re.DOTALL).group(1)
    assert re.findall(r"<td>(.*?)</td>", row) == ["WhatsApp", "3", "0", "1", "1", "1"]


def test_furthest_state_and_the_day_it_counts_on():
    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    later = t0 + timedelta(minutes=5)

    def row(**at):
        base = {"sent_at": None, "delivered_at": None, "read_at": None, "failed_at": None, "channel_kind": "sms"}
        return SimpleNamespace(**{**base, **at})

    assert furthest_state(row()) is None
    assert furthest_state(row(sent_at=t0)) == "sent"
    assert furthest_state(row(sent_at=t0, delivered_at=later)) == "delivered"
    assert furthest_state(row(sent_at=t0, delivered_at=later, read_at=later)) == "read"
    assert furthest_state(row(sent_at=t0, failed_at=later)) == "failed"  # the provider's late "failed"
    assert furthest_state(row(failed_at=t0, sent_at=later)) == "sent"  # a retry that went out
    assert furthest_state(row(failed_at=t0)) == "failed"  # never sent (dead, or refused at once)

    # counted on the local day it was sent (or failed), not on the day it was read
    evening = datetime(2026, 11, 30, 22, 0, tzinfo=TZ)  # read at 01:00 the next day
    per_day, by_kind = tally([row(sent_at=evening, read_at=evening + timedelta(hours=3)),
                              row(failed_at=evening + timedelta(hours=3))], start=t0 - timedelta(days=2), tz=TZ)
    assert per_day == {"2026-11-30": {"read": 1, "delivered": 0, "sent": 0, "failed": 0},
                       "2026-12-01": {"read": 0, "delivered": 0, "sent": 0, "failed": 1}}
    assert by_kind == {"sms": {"read": 1, "delivered": 0, "sent": 0, "failed": 1}}
    # before the window's start: left out, even when read inside it
    assert tally([row(sent_at=t0 - timedelta(days=3), read_at=t0)], start=t0 - timedelta(days=2), tz=TZ) == ({}, {})


def test_failure_alert_counts_each_message_once(owner, tenants, rt):
    a, _ = tenants
    now = engine_clock.now()
    # sent, then failed (provider status) within the hour: one attempt, one failure
    _set(rt, a.message_id, status="failed", sent_at=now - timedelta(minutes=20), failed_at=now - timedelta(minutes=5))
    page = owner.get("/admin/").get_data(as_text=True)
    assert "falhas na última hora (1 de 1)" in page
    assert "100% dos envios falharam na última hora" in page
    assert "Últimos 30 dias" in page


def test_no_failure_alert_under_ten_percent_and_the_pending_alert(owner, tenants, rt, monkeypatch):
    page = owner.get("/admin/").get_data(as_text=True)
    assert "falharam na última hora" not in page and "aguardando envio" not in page
    # The tenant has one pending reminder; a lower threshold stands in for 500 of them.
    monkeypatch.setattr(dashboard, "PENDING_ALERT", 0)
    page = owner.get("/admin/").get_data(as_text=True)
    assert "1 mensagens aguardando envio (mais de 0)" in page


def test_the_agent_sees_the_dashboard(agent, tenants):
    page = agent.get("/admin/")
    assert page.status_code == 200 and "Painel da Clínica Clinica-A" in page.text


def test_the_failure_share_and_counts_follow_the_readers_language(rt, clock):
    """Issue 11, finding 6: "0.0%" in the Portuguese console; Babel formats by locale now."""
    from flask import Flask
    from flask_babel import force_locale

    from admin.i18n import format_number_local, format_percent_local, init_i18n

    app = Flask(__name__)
    init_i18n(app)
    with app.test_request_context():
        with force_locale("pt_BR"):
            assert (format_percent_local(0.0), format_percent_local(0.125), format_number_local(12345)) == \
                ("0%", "12,5%", "12.345")
        with force_locale("en"):
            assert (format_percent_local(0.125), format_number_local(12345)) == ("12.5%", "12,345")
