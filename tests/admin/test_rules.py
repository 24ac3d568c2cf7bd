"""The reminder-rules page (/admin/rules/): rules grouped by purpose with one toggle per channel
kind, the org's sending window, one save in one transaction that re-populates the queue at once;
owner/manager edit, agent reads; another org's rule answers 404; CSRF is required."""

from __future__ import annotations

import re
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from sqlalchemy import func, select

from admin.views.settings.rules import timing_label, toggled_kinds
from engine.store.models import audit_log, messages, orgs, reminder_rule_kinds, reminder_rules
from engine.tenants.orgs import create_user
from engine.reminders.rules import RULE_CHANGED
from tests.admin.conftest import csrf, login
from tests.factories import World

URL = "/admin/rules/"


class _GridForm(HTMLParser):
    """What a browser would submit from the page's settings form, as {name: [values]}."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, list[str]] = {}
        self.inside = False
        self.select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and (a.get("action") or "").endswith(URL):
            self.inside = True
        if not self.inside:
            return
        if tag == "input" and a.get("name"):
            kind = a.get("type", "text")
            if kind != "checkbox" or "checked" in a:
                self.fields.setdefault(a["name"], []).append(a.get("value") or "")
        elif tag == "select":
            self.select = a.get("name")
        elif tag == "option" and self.select and "selected" in a:
            self.fields.setdefault(self.select, []).append(a.get("value") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        if tag == "select":
            self.select = None


def grid_form(html: str) -> dict[str, list[str]]:
    parser = _GridForm()
    parser.feed(html)
    assert "csrf_token" in parser.fields, "the settings form carries no CSRF token"
    return parser.fields


def checkbox(html: str, input_id: str) -> str:
    match = re.search(rf'<input[^>]*id="{re.escape(input_id)}"[^>]*>', html)
    assert match, f"no input #{input_id}"
    return match.group(0)


def is_checked(html: str, input_id: str) -> bool:
    return re.search(r"\schecked[\s>]", checkbox(html, input_id)) is not None


def kinds_of(rt, rule_id: int) -> list[str]:
    with rt.db.connect() as conn:
        return list(conn.execute(select(reminder_rule_kinds.c.kind).where(reminder_rule_kinds.c.rule_id == rule_id)
                                 .order_by(reminder_rule_kinds.c.position)).scalars())


def snapshot(rt) -> tuple:
    """Everything a save may change: rules, kinds, org settings, audit rows and messages."""
    with rt.db.connect() as conn:
        return (
            conn.execute(select(reminder_rules.c.id, reminder_rules.c.active, reminder_rules.c.updated_at)
                         .order_by(reminder_rules.c.id)).all(),
            conn.execute(select(reminder_rule_kinds.c.rule_id, reminder_rule_kinds.c.kind, reminder_rule_kinds.c.position)
                         .order_by(reminder_rule_kinds.c.rule_id, reminder_rule_kinds.c.position)).all(),
            conn.execute(select(orgs.c.id, orgs.c.quiet_start, orgs.c.quiet_end, orgs.c.skip_sundays,
                                orgs.c.skip_holidays, orgs.c.state).order_by(orgs.c.id)).all(),
            conn.execute(select(func.count()).select_from(audit_log)).scalar_one(),
            conn.execute(select(messages.c.id, messages.c.status, messages.c.idempotency_key)
                         .order_by(messages.c.id)).all(),
        )


@pytest.fixture
def rules(tenants):
    """Org A's rules beyond the fixture's '2 h before, WhatsApp': the reference mock's grid."""
    a, _ = tenants
    w = a.world
    return {
        "24h": w.rule(1440, ("whatsapp", "email")),
        "2h": a.rule_id,
        "30min": w.rule(30, ("sms",), active=False),
        "create": w.rule(0, ("email",), trigger="on_create", purpose="session_confirmation"),
        "cancel": w.rule(0, ("whatsapp", "email"), trigger="on_cancel", purpose="session_cancellation"),
    }


# --- the page -----------------------------------------------------------------------------------
def test_grid_groups_rules_by_purpose_with_a_toggle_per_kind(owner, tenants, rules):
    _, b = tenants
    page = owner.get(URL)
    assert page.status_code == 200
    html = page.text
    for text in ("Lembrete de sessão", "Confirmação", "Cancelamento", "24 horas antes", "2 horas antes",
                 "30 min antes", "Imediata (ao criar)", "Imediata (ao cancelar)", "WhatsApp", "SMS", "E-mail",
                 "Salvar configurações", "Nova regra", "Horário permitido", "Não enviar aos domingos",
                 "Não enviar em feriados"):
        assert text in html, text
    # the reminders of one purpose, in the order they happen: 24 h, then 2 h, then 30 min before
    assert html.index("24 horas antes") < html.index("2 horas antes") < html.index("30 min antes")
    assert html.index("Lembrete de sessão") < html.index("Imediata (ao criar)") < html.index("Imediata (ao cancelar)")
    # the page says how several kinds are used and where the order is set
    assert "primeiro disponível na ordem" in html and "“Editar”" in html
    expected = {"24h": {"whatsapp", "email"}, "2h": {"whatsapp"}, "30min": {"sms"}, "create": {"email"},
                "cancel": {"whatsapp", "email"}}
    for key, rule_id in rules.items():
        for kind in ("whatsapp", "sms", "email"):
            assert is_checked(html, f"kind-{rule_id}-{kind}") == (kind in expected[key]), (key, kind)
        assert is_checked(html, f"active-{rule_id}") == (key != "30min")
        assert f"/admin/rules/edit/?id={rule_id}" in html
    assert "1. WhatsApp</span> → <span class=\"badge badge-light border\">2. E-mail" in html  # the order shown
    assert f'name="rule" value="{b.rule_id}"' not in html  # the other org's rule is not on the page
    assert 'value="08:00"' in html and 'value="20:00"' in html
    assert re.search(r'<option value="SP"\s+selected', html)


def test_an_org_without_rules_is_told_what_to_do(app, rt, clock, tenants):
    empty = World(rt, slug="clinica-vazia")
    with rt.db.begin() as conn:
        create_user(conn, org_id=empty.org_id, email="dona@vazia.com.br", role="owner", password="senha-forte-a")
    html = login(app.test_client(), "dona@vazia.com.br").get(URL).text
    assert "Nenhuma regra" in html and "/admin/rules/new/" in html
    assert "Salvar configurações" in html  # the sending window can be set before the first rule


# --- saving -------------------------------------------------------------------------------------
def test_toggling_keeps_the_order_of_kinds_still_on_and_appends_new_ones(owner, tenants, rules, rt):
    a, _ = tenants
    rid = a.world.rule(60, ("sms", "whatsapp"))
    fields = grid_form(owner.get(URL).text)
    fields[f"kind-{rid}"] = ["whatsapp", "sms", "email"]  # the order a browser posts them in: columns
    fields[f"kind-{rules['24h']}"] = ["email", "sms"]  # whatsapp off, sms on
    response = owner.post(URL, data=fields)
    assert response.status_code == 302, response.text
    assert kinds_of(rt, rid) == ["sms", "whatsapp", "email"]
    assert kinds_of(rt, rules["24h"]) == ["email", "sms"]

    fields = grid_form(owner.get(URL).text)
    fields[f"kind-{rid}"] = ["whatsapp", "email"]  # sms off: the others keep their order
    assert owner.post(URL, data=fields).status_code == 302
    assert kinds_of(rt, rid) == ["whatsapp", "email"]
    with rt.db.connect() as conn:
        audits = conn.execute(select(audit_log).where(audit_log.c.entity == "reminder_rule_kinds",
                                                      audit_log.c.entity_id == rid).order_by(audit_log.c.id)).all()
    assert [x.changes["kinds"] for x in audits] == [["sms", "whatsapp", "email"], ["whatsapp", "email"]]
    assert all(x.user_id is not None and x.org_id == a.world.org_id for x in audits)
    page = owner.get(URL).text
    assert "Configurações salvas" in page
    assert not is_checked(page, f"kind-{rid}-sms") and is_checked(page, f"kind-{rid}-email")


def test_switching_a_rule_off_and_on(owner, tenants, rt):
    a, _ = tenants
    fields = grid_form(owner.get(URL).text)
    del fields[f"active-{a.rule_id}"]
    assert owner.post(URL, data=fields).status_code == 302
    with rt.db.connect() as conn:
        assert conn.execute(select(reminder_rules.c.active).where(reminder_rules.c.id == a.rule_id)).scalar_one() is False
        audit = conn.execute(select(audit_log).where(audit_log.c.entity == "reminder_rules",
                                                     audit_log.c.entity_id == a.rule_id)).one()
    assert audit.changes == {"active": False}
    # its reminder that had not gone out is cancelled at once …
    old = a.world.message(a.message_id)
    assert old.status == "cancelled" and old.skip_reason == RULE_CHANGED
    page = owner.get(URL).text
    assert not is_checked(page, f"active-{a.rule_id}") and "0 lembretes reagendados, 1 cancelado, 0 novos." in page

    # … and switching it back on queues it again (the cancelled row gave its key up)
    fields = grid_form(owner.get(URL).text)
    fields[f"active-{a.rule_id}"] = ["1"]
    assert owner.post(URL, data=fields).status_code == 302
    live = a.world.messages(rule_id=a.rule_id, status="pending")
    assert len(live) == 1 and live[0].id != a.message_id and live[0].appointment_id == a.appointment_id


def test_window_settings_are_saved_audited_and_shown(owner, tenants, rt):
    a, b = tenants
    fields = grid_form(owner.get(URL).text)
    fields.update(quiet_start=["09:00"], quiet_end=["18:30"], state=["RJ"], skip_holidays=["1"])
    fields.pop("skip_sundays", None)
    response = owner.post(URL, data=fields)
    assert response.status_code == 302, response.text
    with rt.db.connect() as conn:
        org = conn.execute(select(orgs).where(orgs.c.id == a.world.org_id)).one()
        other = conn.execute(select(orgs).where(orgs.c.id == b.world.org_id)).one()
        audit = conn.execute(select(audit_log).where(audit_log.c.entity == "orgs")).one()
    assert (org.quiet_start, org.quiet_end, org.skip_sundays, org.skip_holidays, org.state) == \
        ("09:00", "18:30", False, True, "RJ")
    assert (other.quiet_start, other.quiet_end, other.skip_sundays, other.state) == ("08:00", "20:00", True, "SP")
    assert audit.org_id == a.world.org_id and audit.entity_id == a.world.org_id
    assert audit.changes == {"quiet_start": "09:00", "quiet_end": "18:30", "skip_sundays": False, "state": "RJ"}
    html = owner.get(URL).text
    assert 'value="09:00"' in html and 'value="18:30"' in html
    assert re.search(r'<option value="RJ"\s+selected', html)
    assert not is_checked(html, "skip_sundays") and is_checked(html, "skip_holidays")

    # national holidays only
    fields = grid_form(html)
    fields["state"] = [""]
    assert owner.post(URL, data=fields).status_code == 302
    with rt.db.connect() as conn:
        assert conn.execute(select(orgs.c.state).where(orgs.c.id == a.world.org_id)).scalar_one() is None


@pytest.mark.parametrize(("start", "end", "field", "message"), [
    ("25:00", "20:00", "quiet_start", "Horário inválido"),
    ("08:00", "8h", "quiet_end", "Horário inválido"),
    ("18:00", "09:00", "quiet_end", "depois do início"),
    ("12:00", "12:00", "quiet_end", "depois do início"),
])
def test_a_bad_window_saves_nothing_and_says_why(owner, tenants, rules, rt, start, end, field, message):
    before = snapshot(rt)
    fields = grid_form(owner.get(URL).text)
    fields[f"kind-{rules['2h']}"] = ["whatsapp", "sms"]  # a valid grid change in the same POST
    fields.pop(f"active-{rules['24h']}")
    fields.update(quiet_start=[start], quiet_end=[end], state=["MG"])
    response = owner.post(URL, data=fields)
    assert response.status_code == 200
    html = response.text
    assert message in html and "Nada foi salvo" in html
    assert re.search(rf'class="form-control is-invalid" id="{field}"', html)
    assert snapshot(rt) == before  # neither the grid nor the window
    # the page shows what was posted, so nothing typed is lost
    assert is_checked(html, f"kind-{rules['2h']}-sms") and not is_checked(html, f"active-{rules['24h']}")
    assert re.search(r'<option value="MG"\s+selected', html)


def test_a_rule_left_without_any_channel_is_refused_next_to_its_row(owner, tenants, rules, rt):
    before = snapshot(rt)
    fields = grid_form(owner.get(URL).text)
    fields.pop(f"kind-{rules['24h']}")
    fields["quiet_start"] = ["07:00"]
    response = owner.post(URL, data=fields)
    assert response.status_code == 200
    html = response.text
    row = re.search(rf'<tr id="rule-{rules["24h"]}".*?</tr>', html, re.DOTALL).group(0)
    assert "table-danger" in row and "Marque ao menos um canal" in row and "desmarque “Ativa”" in row
    assert snapshot(rt) == before


def test_a_switched_off_rule_stored_without_channels_does_not_block_the_page(owner, tenants, rt):
    a, _ = tenants
    bare = a.world.rule(45, (), active=False)
    fields = grid_form(owner.get(URL).text)
    assert fields["rule"].count(str(bare)) == 1 and f"kind-{bare}" not in fields
    fields["quiet_end"] = ["19:00"]
    assert owner.post(URL, data=fields).status_code == 302
    assert kinds_of(rt, bare) == []
    fields = grid_form(owner.get(URL).text)
    fields[f"active-{bare}"] = ["1"]  # but it cannot be switched on without a channel
    response = owner.post(URL, data=fields)
    assert response.status_code == 200 and "Marque ao menos um canal" in response.text


def test_an_unknown_state_is_refused(owner, tenants, rt):
    before = snapshot(rt)
    fields = grid_form(owner.get(URL).text)
    fields["state"] = ["XX"]
    response = owner.post(URL, data=fields)
    assert response.status_code == 200 and "Escolha um estado da lista" in response.text
    assert snapshot(rt) == before


def test_saving_queues_the_reminders_of_a_rule_switched_on_at_once(owner, tenants, rt):
    a, _ = tenants
    hour_before = a.world.rule(60, ("whatsapp",), active=False)
    assert a.world.messages(rule_id=hour_before) == []
    fields = grid_form(owner.get(URL).text)
    fields[f"active-{hour_before}"] = ["1"]
    assert owner.post(URL, data=fields).status_code == 302
    queued = a.world.messages(rule_id=hour_before)
    assert len(queued) == 1
    assert queued[0].appointment_id == a.appointment_id and queued[0].status in ("pending", "new")
    assert queued[0].channel_kind == "whatsapp"
    assert "0 lembretes reagendados, 0 cancelados, 1 novo." in owner.get(URL).text


def test_turning_off_the_kind_a_reminder_was_queued_on_moves_it_to_the_next(owner, tenants, rt):
    a, _ = tenants
    a.world.channel("sms")
    fields = grid_form(owner.get(URL).text)
    fields[f"kind-{a.rule_id}"] = ["sms"]  # whatsapp off, sms on
    assert owner.post(URL, data=fields).status_code == 302
    assert a.world.message(a.message_id).status == "cancelled"
    live = a.world.messages(rule_id=a.rule_id, status="pending")
    assert [m.channel_kind for m in live] == ["sms"]


def test_saving_nothing_changes_nothing(owner, tenants, rules, rt):
    before = snapshot(rt)
    response = owner.post(URL, data=grid_form(owner.get(URL).text))
    assert response.status_code == 302
    assert snapshot(rt) == before
    assert "Nada mudou" in owner.get(URL).text


# --- roles, tenants, CSRF -----------------------------------------------------------------------
def test_agent_sees_the_page_read_only_and_cannot_post(agent, tenants, rules, rt):
    a, _ = tenants
    page = agent.get(URL)
    assert page.status_code == 200
    html = page.text
    assert "24 horas antes" in html and "modo leitura" in html
    assert "Salvar configurações" not in html and "/admin/rules/new/" not in html
    assert "<fieldset disabled>" in html
    before = snapshot(rt)
    fields = grid_form(html)
    fields[f"kind-{a.rule_id}"] = ["sms"]
    fields["quiet_start"] = ["06:00"]
    assert agent.post(URL, data=fields).status_code == 403
    assert snapshot(rt) == before


def test_a_manager_can_save(app, tenants, rt):
    a, _ = tenants
    manager = login(app.test_client(), "manager@a.com.br")
    fields = grid_form(manager.get(URL).text)
    fields["quiet_end"] = ["19:00"]
    assert manager.post(URL, data=fields).status_code == 302
    with rt.db.connect() as conn:
        assert conn.execute(select(orgs.c.quiet_end).where(orgs.c.id == a.world.org_id)).scalar_one() == "19:00"


@pytest.mark.parametrize("how", ["hidden", "toggle", "active"])
def test_another_orgs_rule_id_answers_404_and_changes_nothing(owner, tenants, rt, how):
    a, b = tenants
    before = snapshot(rt)
    mine = grid_form(owner.get(URL).text)
    mine[f"kind-{a.rule_id}"] = ["whatsapp", "sms"]  # a change of A's own, which must not happen either
    mine["quiet_start"] = ["10:00"]
    fields = dict(mine)
    if how == "hidden":
        fields["rule"] = mine["rule"] + [str(b.rule_id)]
    elif how == "toggle":
        fields[f"kind-{b.rule_id}"] = ["sms"]
    else:
        fields[f"active-{b.rule_id}"] = ["1"]
    assert owner.post(URL, data=fields).status_code == 404
    assert snapshot(rt) == before
    for bogus in ("abc", "999999"):  # not an id, no such rule: the same answer
        assert owner.post(URL, data={**mine, "rule": mine["rule"] + [bogus]}).status_code == 404
    assert snapshot(rt) == before


def test_a_post_without_the_csrf_token_is_refused(owner, tenants, rt):
    a, _ = tenants
    before = snapshot(rt)
    fields = grid_form(owner.get(URL).text)
    fields["quiet_start"] = ["10:00"]
    fields[f"kind-{a.rule_id}"] = ["sms"]
    del fields["csrf_token"]
    assert owner.post(URL, data=fields).status_code == 400
    assert owner.post(URL, data={**fields, "csrf_token": ["forjado"]}).status_code == 400
    assert snapshot(rt) == before


def test_a_kind_that_does_not_exist_is_a_bad_request(owner, tenants, rt):
    a, _ = tenants
    before = snapshot(rt)
    fields = grid_form(owner.get(URL).text)
    fields[f"kind-{a.rule_id}"] = ["whatsapp", "fax"]
    assert owner.post(URL, data=fields).status_code == 400
    assert snapshot(rt) == before


# --- the per-rule forms ---------------------------------------------------------------------------
def test_create_and_edit_forms_still_work_and_set_the_order(owner, tenants, rt):
    a, _ = tenants
    token = csrf(owner.get("/admin/rules/new/").text)
    response = owner.post("/admin/rules/new/", data={
        "csrf_token": token, "name": "Lembrete 3 h", "purpose": "session_reminder", "template_key": "session_reminder",
        "trigger": "before_start", "offset_minutes": "180", "kinds": "sms, whatsapp", "respect_window": "y",
        "active": "y",
    })
    assert response.status_code == 302 and response.headers["Location"].endswith(URL)
    with rt.db.connect() as conn:
        rule = conn.execute(select(reminder_rules).where(reminder_rules.c.name == "Lembrete 3 h")).one()
    assert rule.org_id == a.world.org_id and kinds_of(rt, rule.id) == ["sms", "whatsapp"]
    assert "3 horas antes" in owner.get(URL).text
    # the appointment 5 h from now got its 3-hours-before reminder (on WhatsApp: no SMS channel)
    assert [m.channel_kind for m in a.world.messages(rule_id=rule.id)] == ["whatsapp"]

    edit = owner.get(f"/admin/rules/edit/?id={rule.id}")
    assert edit.status_code == 200 and 'value="sms, whatsapp"' in edit.text
    response = owner.post(f"/admin/rules/edit/?id={rule.id}", data={
        "csrf_token": csrf(edit.text), "name": "Lembrete 3 h", "purpose": "session_reminder",
        "template_key": "session_reminder", "trigger": "before_start", "offset_minutes": "180",
        "kinds": "whatsapp, email, sms", "respect_window": "y", "active": "y",
    })
    assert response.status_code == 302
    assert kinds_of(rt, rule.id) == ["whatsapp", "email", "sms"]
    bad = owner.post(f"/admin/rules/edit/?id={rule.id}", data={
        "csrf_token": csrf(edit.text), "name": "Lembrete 3 h", "purpose": "session_reminder",
        "template_key": "session_reminder", "trigger": "before_start", "offset_minutes": "180", "kinds": "fax",
    })
    assert bad.status_code == 200 and "Canal desconhecido: fax" in bad.text
    assert kinds_of(rt, rule.id) == ["whatsapp", "email", "sms"]
    details = owner.get(f"/admin/rules/details/?id={rule.id}").text
    assert "WhatsApp → E-mail → SMS" in details and "3 horas antes" in details


# --- the pure parts -------------------------------------------------------------------------------
def test_toggled_kinds_keeps_order_and_appends_in_column_order():
    assert toggled_kinds(["sms", "whatsapp"], ["whatsapp", "sms", "email"]) == ["sms", "whatsapp", "email"]
    assert toggled_kinds(["email"], ["sms", "whatsapp", "email"]) == ["email", "whatsapp", "sms"]
    assert toggled_kinds(["email", "whatsapp"], ["whatsapp"]) == ["whatsapp"]
    assert toggled_kinds(["whatsapp"], []) == []


@pytest.mark.parametrize(("trigger", "minutes", "label"), [
    ("before_start", 1440, "24 horas antes"), ("before_start", 60, "1 hora antes"),
    ("before_start", 2880, "2 dias antes"), ("before_start", 30, "30 min antes"),
    ("before_start", 90, "1 h 30 min antes"), ("before_start", 0, "No horário da sessão"),
    ("after_start", 120, "2 horas depois"), ("on_create", 0, "Imediata (ao criar)"),
    ("on_cancel", 0, "Imediata (ao cancelar)"),
])
def test_timing_labels(app, trigger, minutes, label):
    with app.test_request_context():
        assert timing_label(trigger, minutes) == label


# --- what a save does to reminders already queued (finding 5) -------------------------------------
def _due(rt, message_id: int):
    with rt.db.connect() as conn:
        return conn.execute(select(messages.c.due_at).where(messages.c.id == message_id)).scalar_one()


def test_a_window_change_moves_the_queued_reminders_and_says_so(owner, tenants, rt):
    a, b = tenants
    # both orgs: a session at 14:00 local with its 2-hours-before reminder queued for 12:00 local
    a_due, b_due = _due(rt, a.message_id), _due(rt, b.message_id)
    assert a_due == b_due
    fields = grid_form(owner.get(URL).text)
    fields["quiet_start"] = ["13:00"]  # 12:00 is now outside; nothing allowed before it: 13:00
    assert owner.post(URL, data=fields).status_code == 302
    assert _due(rt, a.message_id) == a_due + timedelta(hours=1)
    assert a.world.events(a.message_id)[-1] == "planned"
    page = owner.get(URL).text
    assert "Configurações salvas. 1 lembrete reagendado, 0 cancelados, 0 novos." in page
    # the other clinic's queue did not move
    assert _due(rt, b.message_id) == b_due and b.world.events(b.message_id) == ["queued"]


def test_a_save_that_keeps_every_reminders_time_says_none_was_rescheduled(owner, tenants, rt):
    # Unticking "respect the window" rewrites the queued row's copy of the flag, but 12:00 was
    # allowed anyway: its time stays, and the flash must not count it as rescheduled.
    a, _b = tenants
    a_due = _due(rt, a.message_id)
    edit = owner.get(f"/admin/rules/edit/?id={a.rule_id}")
    assert owner.post(f"/admin/rules/edit/?id={a.rule_id}", data={
        "csrf_token": csrf(edit.text), "name": "Lembrete 2 h", "purpose": "session_reminder",
        "template_key": "session_reminder", "trigger": "before_start", "offset_minutes": "120",
        "kinds": "whatsapp", "active": "y",
    }).status_code == 302
    with rt.db.connect() as conn:
        row = conn.execute(select(messages.c.due_at, messages.c.respect_window)
                           .where(messages.c.id == a.message_id)).one()
    assert row.due_at == a_due and not row.respect_window
    page = owner.get(URL).text
    assert "Nenhum lembrete da fila mudou." in page and "reagendado" not in page
    assert "Registro salvo com sucesso" not in page  # one flash per save: the one that says what it did


def test_an_offset_changed_in_the_rule_form_moves_its_queued_reminders(owner, tenants, rt):
    a, b = tenants
    a_due, b_due = _due(rt, a.message_id), _due(rt, b.message_id)
    edit = owner.get(f"/admin/rules/edit/?id={a.rule_id}")
    response = owner.post(f"/admin/rules/edit/?id={a.rule_id}", data={
        "csrf_token": csrf(edit.text), "name": "Lembrete 3 h", "purpose": "session_reminder",
        "template_key": "session_reminder", "trigger": "before_start", "offset_minutes": "180",
        "kinds": "whatsapp", "respect_window": "y", "active": "y",
    })
    assert response.status_code == 302
    assert _due(rt, a.message_id) == a_due - timedelta(hours=1)
    assert "1 lembrete reagendado, 0 cancelados, 0 novos." in owner.get(URL).text
    assert _due(rt, b.message_id) == b_due
    # another org's rule in the form: 404, and nothing of B's moves
    assert owner.get(f"/admin/rules/edit/?id={b.rule_id}").status_code == 404
    assert owner.post(f"/admin/rules/edit/?id={b.rule_id}", data={
        "csrf_token": csrf(edit.text), "name": "x", "purpose": "session_reminder", "template_key": "session_reminder",
        "trigger": "before_start", "offset_minutes": "1440", "kinds": "whatsapp", "active": "y",
    }).status_code == 404
    assert _due(rt, b.message_id) == b_due


def test_a_change_without_the_csrf_token_moves_nothing(owner, tenants, rt):
    a, _ = tenants
    a_due = _due(rt, a.message_id)
    fields = grid_form(owner.get(URL).text)
    fields["quiet_start"] = ["13:00"]
    del fields["csrf_token"]
    assert owner.post(URL, data=fields).status_code == 400
    edit = owner.get(f"/admin/rules/edit/?id={a.rule_id}")
    assert edit.status_code == 200
    owner.post(f"/admin/rules/edit/?id={a.rule_id}", data={
        "name": "Lembrete 3 h", "purpose": "session_reminder", "template_key": "session_reminder",
        "trigger": "before_start", "offset_minutes": "180", "kinds": "whatsapp", "respect_window": "y", "active": "y",
    })
    assert _due(rt, a.message_id) == a_due and a.world.events(a.message_id) == ["queued"]


def test_the_page_says_what_a_save_does_to_the_queue(owner, tenants):
    html = owner.get(URL).text
    assert "atualizados na hora" not in html
    assert "ainda na fila dos próximos agendamentos passam para o novo horário" in html
    assert "os que já estão sendo enviados não mudam" in html
