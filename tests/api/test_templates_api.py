"""`/api/v1/templates` (issue 30, point 1): list and get the org's templates and the defaults with
their Meta mapping, customise a default, change an override's mapping; a mapping that cannot work at
Meta is a 422 listing every problem, nothing written; another org's template is a 404.

The clinic's WhatsApp goes through Meta's Cloud API on the loopback Graph fake, whose WABA holds the
fixtures' templates (tests/fakes/meta.py)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from sqlalchemy import select

from engine.tenants.channels import create_channel
from engine.store.models import audit_log, templates
from tests.api.conftest import api_for
from tests.factories import World
from tests.fakes.meta import FakeGraph
from tests.fakes.server import Reply

WABA = "102290129340398"
SORRISO = {"name": "lembrete_sorriso", "language": "pt_BR", "parameters": ["nome", "profissional", "data", "hora"],
           "buttons": ["confirm", "cancel"]}


@pytest.fixture(scope="module")
def graph() -> Iterator[FakeGraph]:
    with FakeGraph() as server:
        yield server


@pytest.fixture
def fake(graph: FakeGraph) -> FakeGraph:
    return graph.reset()


@pytest.fixture
def meta_api(rt, client, clock, fake):
    world = World(rt, slug="sorriso")
    with rt.db.begin() as conn:
        world.channels["whatsapp"] = create_channel(
            conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="meta", name="WhatsApp oficial",
            credentials={"phone_number_id": "1122334455667", "access_token": "EAAG-token", "app_secret": "s" * 32,
                         "verify_token": "verifique-o-webhook", "base_url": fake.url, "waba_id": WABA})
    return api_for(rt, client, world)


def default_id(api: Any, key: str = "session_reminder", kind: str = "whatsapp") -> int:
    [row] = [t for t in api.get("/templates").get_json()["data"]
             if (t["origin"], t["key"], t["channel_kind"], t["locale"]) == ("default", key, kind, "pt_BR")]
    return row["id"]


def customised(api: Any, **body: Any) -> dict[str, Any]:
    answer = api.post("/templates", {"key": "session_reminder", "channel_kind": "whatsapp", **body})
    assert answer.status_code == 201, answer.get_json()
    return answer.get_json()


def codes(answer: Any) -> list[tuple[str, str]]:
    return [(d["code"], d["field"]) for d in answer.get_json()["details"]]


def test_list_and_get_show_each_template_s_meta_mapping_and_what_meta_receives(meta_api):
    data = meta_api.get("/templates").get_json()["data"]
    reminder = next(t for t in data if t["id"] == default_id(meta_api))
    assert reminder["origin"] == "default" and reminder["meta_inherited"] is False
    assert reminder["meta"] == {"name": "session_reminder_v1", "language": "pt_BR",
                                "parameters": ["nome", "profissional", "data", "hora", "modalidade"],
                                "buttons": ["confirm", "cancel"]}
    assert [p["text"] for p in reminder["meta_preview"]["components"][0]["parameters"]] == \
        ["Ana", "Dra. Beatriz Costa", "21/03", "14:00", "Presencial"]
    email = next(t for t in data if (t["key"], t["channel_kind"]) == ("session_reminder", "email"))
    assert (email["meta"], email["meta_preview"]) == (None, None)
    assert meta_api.get(f"/templates/{reminder['id']}").get_json() == reminder


def test_a_customised_template_keeps_its_default_mapping_until_given_its_own(rt, meta_api, fake):
    own = customised(meta_api, body="Oi, {{ nome }}! Até {{ data }}.")
    assert (own["origin"], own["meta_inherited"], own["meta"]["name"]) == ("clinic", True, "session_reminder_v1")
    assert own["warnings"] == []
    changed = meta_api.patch(f"/templates/{own['id']}", {"meta": SORRISO})
    assert changed.status_code == 200, changed.get_json()
    assert (changed.get_json()["meta"], changed.get_json()["meta_inherited"]) == (SORRISO, False)
    with rt.db.connect() as conn:
        row = conn.execute(select(templates).where(templates.c.id == own["id"])).one()
        audit = conn.execute(select(audit_log).where(audit_log.c.entity == "templates",
                                                     audit_log.c.entity_id == own["id"],
                                                     audit_log.c.action == "update")).one()
    assert (row.meta_template_name, row.meta_parameters, row.meta_buttons) == \
        ("lembrete_sorriso", SORRISO["parameters"], SORRISO["buttons"])
    assert audit.api_key_id == meta_api.key_id and audit.changes["meta"]["name"] == "lembrete_sorriso"
    back = meta_api.patch(f"/templates/{own['id']}", {"meta": None}).get_json()
    assert (back["meta"]["name"], back["meta_inherited"]) == ("session_reminder_v1", True)


@pytest.mark.parametrize("meta, expected", [
    ({**SORRISO, "name": "volte_a_sorrir", "parameters": ["nome"], "buttons": []},
     [("waba_template_not_approved", "meta.name")]),
    ({**SORRISO, "parameters": ["nome", "data"]}, [("waba_template_parameter_count", "meta.parameters")]),
    ({**SORRISO, "buttons": ["confirm"]}, [("waba_template_buttons", "meta.buttons")]),
    ({**SORRISO, "name": "nao_existe"}, [("waba_template_not_found", "meta.name")]),
    ({**SORRISO, "name": "aviso_com_nome", "parameters": ["nome"], "buttons": []},
     [("waba_template_named_parameters", "meta.parameters")]),
], ids=["pending", "parameter-count", "buttons", "not-found", "named"])
def test_a_mapping_meta_would_refuse_is_a_422_and_nothing_changes(rt, meta_api, fake, meta, expected):
    own = customised(meta_api, body="Oi, {{ nome }}!")
    refused = meta_api.patch(f"/templates/{own['id']}", {"meta": meta, "body": "Mudou"})
    assert refused.status_code == 422
    assert codes(refused) == expected
    detail = refused.get_json()["details"][0]
    assert detail["message"] != detail["message_en"] and meta["name"] in detail["message_en"]
    assert meta_api.get(f"/templates/{own['id']}").get_json()["body"] == "Oi, {{ nome }}!"


def test_every_problem_is_listed_at_once(meta_api, fake):
    own = customised(meta_api, body="Oi")
    refused = meta_api.patch(f"/templates/{own['id']}", {"body": "Oi {{ nome ", "meta": {
        "name": "Lembrete Novo", "language": "português", "parameters": ["nome", "telefone"], "buttons": []}})
    assert refused.status_code == 422
    assert codes(refused) == [("template_text_invalid", "body"), ("waba_name_invalid", "meta.name"),
                              ("waba_language_invalid", "meta.language"),
                              ("waba_parameter_unknown", "meta.parameters")]
    # The shape is the schema's: unknown fields, wrong types and bad buttons, each by field name.
    shape = meta_api.patch(f"/templates/{own['id']}", {"meta": {"name": 3, "parameters": "nome",
                                                                "buttons": ["ligar"], "extra": 1}, "cor": "azul"})
    assert shape.status_code == 422
    details = shape.get_json()["details"]
    assert set(details) == {"meta", "cor"} and set(details["meta"]) == {"name", "language", "parameters",
                                                                          "buttons", "extra"}
    assert meta_api.patch(f"/templates/{own['id']}", {"body": "  \n "}).get_json()["details"] == \
        {"body": ["Must not be blank."]}
    assert meta_api.patch(f"/templates/{own['id']}", data=b"{nope",
                          headers={"Content-Type": "application/json"}).status_code == 400


def test_an_unmapped_template_is_refused_at_save_not_at_send(rt, meta_api, fake):
    # No Spanish default: a Spanish reminder on Meta needs its own approved template.
    refused = meta_api.post("/templates", {"key": "session_reminder", "channel_kind": "whatsapp", "locale": "es",
                                           "body": "Hola {{ nome }}"})
    assert refused.status_code == 422 and codes(refused) == [("waba_template_unmapped", "meta.name")]
    fake.reset(*[Reply(503, b"")] * 4)  # Meta down changes nothing to that
    again = meta_api.post("/templates", {"key": "session_reminder", "channel_kind": "whatsapp", "locale": "es",
                                         "body": "Hola {{ nome }}"})
    assert codes(again) == [("waba_template_unmapped", "meta.name")]
    with rt.db.connect() as conn:
        assert conn.execute(select(templates).where(templates.c.org_id == meta_api.world.org_id)).all() == []
    mapped = meta_api.post("/templates", {"key": "session_reminder", "channel_kind": "whatsapp", "locale": "es",
                                          "body": "Hola {{ nome }}", "meta": {**SORRISO, "language": "es"}})
    assert mapped.status_code == 201
    assert [w["code"] for w in mapped.get_json()["warnings"]] == ["waba_templates_unreachable"]


def test_when_meta_cannot_be_asked_the_save_is_kept_with_a_warning(meta_api, fake):
    own = customised(meta_api, body="Oi")
    fake.reset(*[Reply(503, b"")] * 4)
    saved = meta_api.patch(f"/templates/{own['id']}", {"meta": SORRISO})
    assert saved.status_code == 200
    [warning] = saved.get_json()["warnings"]
    assert warning["code"] == "waba_templates_unreachable" and "Meta" in warning["message_en"]
    assert saved.get_json()["meta"] == SORRISO


def test_defaults_are_read_only_and_an_org_customises_once(meta_api, fake):
    read_only = meta_api.patch(f"/templates/{default_id(meta_api)}", {"body": "Mudei o padrão"})
    assert read_only.status_code == 409 and codes(read_only) == [("template_default_read_only", "meta")]
    customised(meta_api, body="Oi")
    twice = meta_api.post("/templates", {"key": "session_reminder", "channel_kind": "whatsapp"})
    assert twice.status_code == 409 and codes(twice) == [("template_exists", "meta")]
    assert meta_api.get(f"/templates/{default_id(meta_api)}").get_json()["body"] != "Mudei o padrão"


def test_another_org_s_template_is_a_404_to_read_and_to_change(rt, client, meta_api, other, fake):
    own = customised(meta_api, body="Só da Sorriso")
    assert other.get(f"/templates/{own['id']}").status_code == 404
    assert other.patch(f"/templates/{own['id']}", {"body": "Invadi"}).status_code == 404
    assert own["id"] not in [t["id"] for t in other.get("/templates").get_json()["data"]]
    assert meta_api.get(f"/templates/{own['id']}").get_json()["body"] == "Só da Sorriso"
    assert meta_api.get(f"/templates/{2**63 - 1}").status_code == 404


def test_the_waba_s_templates_approved_first_and_why_they_cannot_be_listed(meta_api, other, fake):
    listed = meta_api.get("/templates/waba")
    assert listed.status_code == 200
    data = listed.get_json()["data"]
    assert [t["status"] for t in data][:5] == ["APPROVED"] * 5 and data[-1]["status"] in ("PENDING", "REJECTED")
    sorriso = next(t for t in data if t["name"] == "lembrete_sorriso")
    assert sorriso["parameter_count"] == 4 and sorriso["status_text"] == "aprovado" and sorriso["problems"] == []
    photo = next(t for t in data if t["name"] == "lembrete_com_foto")
    assert [(p["code"], p["field"]) for p in photo["problems"]] == [("waba_template_header", "meta.name")]
    assert [b["type"] for b in sorriso["buttons"]] == ["QUICK_REPLY", "QUICK_REPLY", "PHONE_NUMBER"]
    fake.reset(*[Reply(503, b"")] * 4)
    down = meta_api.get("/templates/waba")
    assert down.status_code == 502 and codes(down) == [("waba_templates_unreachable", "meta")]
    not_meta = other.get("/templates/waba")  # its WhatsApp is a sandbox channel
    assert not_meta.status_code == 409 and codes(not_meta) == [("waba_no_channel", "meta")]


def test_the_openapi_document_describes_the_template_routes(meta_api):
    paths = meta_api.get("/openapi.json").get_json()["paths"]
    assert set(paths["/api/v1/templates"]) == {"get", "post"}
    assert set(paths["/api/v1/templates/{template_id}"]) == {"get", "patch"}
    assert "502" in paths["/api/v1/templates/waba"]["get"]["responses"]


def test_the_list_filters_by_key_channel_language_and_origin_and_refuses_an_unknown_filter(meta_api):
    mine = customised(meta_api, body="Olá {{ nome }}, até {{ data }}.")
    by_key = meta_api.get("/templates?key=session_reminder&channel_kind=whatsapp").get_json()["data"]
    assert {(t["origin"], t["key"], t["channel_kind"]) for t in by_key} == {
        ("default", "session_reminder", "whatsapp"), ("clinic", "session_reminder", "whatsapp")}
    [own] = meta_api.get("/templates?origin=clinic").get_json()["data"]
    assert own["id"] == mine["id"]
    assert meta_api.get("/templates?locale=pt_BR&origin=default").get_json()["data"]
    # A misspelt or unknown filter is refused, never ignored (it would answer every template).
    for query in ("contact_id=1", "chanel_kind=whatsapp", "origin=other", "channel_kind=fax"):
        answer = meta_api.get(f"/templates?{query}")
        assert answer.status_code == 422, query


def test_an_id_in_other_digits_than_ascii_is_no_template(meta_api):
    template_id = default_id(meta_api)
    assert meta_api.get(f"/templates/{template_id}").status_code == 200
    arabic = "".join(chr(0x0660 + int(d)) for d in str(template_id))  # the same number in Arabic-Indic digits
    assert meta_api.get(f"/templates/{arabic}").status_code == 404
    assert meta_api.patch(f"/templates/{arabic}", {"body": "x"}).status_code == 404
