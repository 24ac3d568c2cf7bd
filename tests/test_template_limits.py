"""The bounds of one template render (issue 9, points 2, 3 and 10): CPU, memory, internal reprs.

Tenant-written templates may not run for hours (nested loops), build huge strings (a few ``~``
doublings) or print Python internals (``<function … at 0x…>``), in the console's preview, on save
or at send time. The bounds are proven by counting (the error is raised, the render returns, the
peak allocation stays small), never by timing; every bomb has a pytest-timeout guard so that a
regression fails in seconds instead of hanging the suite.
"""

from __future__ import annotations

import itertools
import tracemalloc
from datetime import UTC, timedelta

import pytest
from sqlalchemy import insert, select

from engine.messaging import dispatch
from engine.messaging import render as render_module
from engine.store.models import message_events, templates
from engine.messaging.render import (
    MAX_RENDER_STEPS,
    MAX_RENDER_VOLUME,
    MAX_VALUE_SIZE,
    SAMPLE_VARIABLES,
    TemplateError,
    render_html,
    render_text,
    validate,
)
from engine.words.texts import Text
from tests.admin.conftest import agent, app, csrf, owner, tenants  # noqa: F401 - the console's fixtures
from tests.factories import World, local

HEAVY = "Modelo pesado demais: "
INTERNAL = "O modelo tenta mostrar um valor interno"
RENDERS = pytest.mark.parametrize("render", [render_text, render_html], ids=["text", "html"])
#: A runaway render fails the test here instead of hanging the suite. It bounds a hang, not a
#: speed (the render's own limits are what the tests check): it also covers the test's fixtures,
#: and on a machine shared with other test processes an app, a login and two previews once took
#: more than 10 s.
GUARD = pytest.mark.timeout(60)

NESTED_LOOPS = "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
#: The issue's memory bomb: 186 characters that built a 102 MB string (100 000 × 2¹⁰).
DOUBLING = "{% set a = 'x' * 100000 %}" + "{% set a = a ~ a %}" * 8 + "{{ a|length }}"


def _msgid(exc: TemplateError) -> str:
    """The sentence's msgid, under the "(linha N)" wrapper when there is one."""
    text = exc.text
    assert isinstance(text, Text)
    while "erro" in text.params and isinstance(text.params["erro"], Text):
        text = text.params["erro"]
    return text.msgid


def _peak_of(call) -> tuple[object, int]:
    tracemalloc.start()
    try:
        try:
            result: object = call()
        except TemplateError as exc:
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- CPU (point 2) -------------------------------------------------------------------------------


@GUARD
@RENDERS
@pytest.mark.parametrize("source", [
    NESTED_LOOPS,
    ("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}{% endfor %}{% endfor %}"
     "{% endfor %}"),
    # loops with no output are not stopped by the output cap
    "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    # inside a {% set %} block, a macro and a filter block, where output is buffered, not streamed
    "{% set x %}" + NESTED_LOOPS + "{% endset %}",
    "{% macro m() %}" + NESTED_LOOPS + "{% endmacro %}{{ m() }}",
    "{% filter upper %}" + NESTED_LOOPS + "{% endfilter %}",
    # exponential macro recursion: no loop at all
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    # recursive loops: loop(...) iterates a new iterable on every level
    "{% set s = 'x' * 100000 %}{% for x in [1] recursive %}{% if x == 1 %}{{ loop(s) }}{% endif %}{% endfor %}",
    # a filter's own iteration (map calls a filter per item)
    "{% for i in range(1000) %}{{ range(1000)|map('string')|join|length }}{% endfor %}",
    ("{% set c = cycler(*range(1000)) %}{% for i in range(1000) %}{% for j in range(1000) %}{% if c.next() %}"
     "{% endif %}{% endfor %}{% endfor %}"),
    "{% for i in range(1000) %}{% for j in range(1000) %}{% if loop.length %}{% endif %}{% endfor %}{% endfor %}",
])
def test_heavy_loops_are_refused_after_a_bounded_number_of_steps(render, source: str) -> None:
    with pytest.raises(TemplateError) as excinfo:
        render(source, {"nome": "Ana"})
    assert str(excinfo.value).startswith(HEAVY)
    assert excinfo.value.text is not None
    assert excinfo.value.lineno == 1
    assert str(excinfo.value).endswith("(linha 1)")


def test_the_step_budget_is_counted_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    # range() is one call, each iteration one step: 11 steps.
    source = "{% for i in range(10) %}{% endfor %}"
    monkeypatch.setattr(render_module, "MAX_RENDER_STEPS", 11)
    assert render_text(source, {}) == ""
    monkeypatch.setattr(render_module, "MAX_RENDER_STEPS", 10)
    with pytest.raises(TemplateError) as excinfo:
        render_text(source, {})
    assert _msgid(excinfo.value) == render_module._HEAVY_STEPS.msgid
    assert excinfo.value.text.params["erro"].params == {"max": MAX_RENDER_STEPS}


@GUARD
@pytest.mark.parametrize("source", [
    # Each iteration is one step but re-reads 100 000 characters or items: the volume budget stops it.
    ("{% set a = 'x' * 100000 %}{% for i in range(1000) %}{% for j in range(1000) %}{% if a.count('y') %}"
     "{% endif %}{% endfor %}{% endfor %}"),
    ("{% set l = ['x'] * 100000 %}{% for i in range(1000) %}{% for j in range(1000) %}{% if 'z' in l %}"
     "{% endif %}{% endfor %}{% endfor %}"),
    ("{% set a = 'x' * 100000 %}{% for i in range(1000) %}{% for j in range(1000) %}{% if a[1:] %}"
     "{% endif %}{% endfor %}{% endfor %}"),
    "{% set l = ['x'] * 100000 %}{% for i in range(1000) %}{% if l|sort %}{% endif %}{% endfor %}",
    "{% set a = 'x ' * 50000 %}{% for i in range(1000) %}{% if a|wordwrap(1) %}{% endif %}{% endfor %}",
    "{% set a = 'x' * 100000 %}{% for i in range(1000) %}{% if a|upper %}{% endif %}{% endfor %}",
])
def test_loops_that_reread_a_large_value_are_refused_by_the_volume_budget(source: str) -> None:
    with pytest.raises(TemplateError) as excinfo:
        render_html(source, {})
    assert _msgid(excinfo.value) == render_module._HEAVY_VOLUME.msgid
    assert excinfo.value.text.params["erro"].params == {"max": MAX_RENDER_VOLUME}


def test_the_cpu_deadline_is_a_backstop_checked_from_the_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake thread clock that jumps 10 s per reading: the first check after the start is past the deadline.
    ticks = itertools.count(step=10.0)
    monkeypatch.setattr(render_module, "_cpu_time", lambda: next(ticks))
    with pytest.raises(TemplateError) as excinfo:
        render_text("{% for i in range(200) %}{{ i }}{% endfor %}", {})
    assert _msgid(excinfo.value) == render_module._HEAVY_CPU.msgid
    assert str(excinfo.value).startswith(HEAVY + "passou de 1 s")


@GUARD
def test_compiling_a_heavy_template_does_no_work() -> None:
    # validate() (the save form's syntax check) and the compile cache never run template code:
    # constant folding is refused by the hooks, so everything is counted at render time.
    validate(NESTED_LOOPS)
    validate("{{ ('x' ~ 'y') * 1000000000 }}{{ 'x'|center(5) }}{{ 'a' in 'abc' }}{{ [1, 2] }}")
    assert render_text("{{ 'x' ~ 'y' }}{{ 'a' in 'abc' }}{{ [1, 2] }}{{ 'ab'[1:] }}", {}) == "xyTrue[1, 2]b"


def test_ordinary_templates_fit_well_within_the_bounds() -> None:
    default = ("Olá, {{ nome }}! Lembrete: sua sessão com {{ profissional }} é {{ dia_semana }}, {{ data }}, às "
               "{{ hora }}.{% if local %}\nLocal: {{ local }}{% endif %}\n\nPara confirmar, responda OK.\n\n"
               "{{ clinica }}")
    assert render_text(default, SAMPLE_VARIABLES).startswith("Olá, Ana! Lembrete: sua sessão com Dra. Beatriz")
    # The largest range() with a few expressions inside, in an e-mail.
    table = ("<table>{% for i in range(1000) %}<tr class=\"{{ loop.cycle('a', 'b') }}\"><td>{{ i }}</td>"
             "<td>{{ nome|upper }}</td></tr>{% endfor %}</table>")
    assert render_html(table, {"nome": "ana"}).count("<tr") == 1000
    items = {"itens": [{"nome": f"item {i}", "preco": i / 2} for i in range(200)]}
    out = render_text("{% for x in itens %}{{ loop.index }}. {{ x.nome|title }}: {{ '%.2f'|format(x.preco) }}\n"
                      "{% endfor %}", items)
    assert out.count("\n") == 200


# --- memory (point 3) ----------------------------------------------------------------------------


@GUARD
@RENDERS
def test_the_doubling_bomb_from_the_issue_fails_with_a_small_peak(render) -> None:
    assert len(DOUBLING) < 230
    result, peak = _peak_of(lambda: render(DOUBLING, {}))
    assert isinstance(result, TemplateError)
    assert _msgid(result) == render_module._HEAVY_VALUE.msgid
    assert str(result).startswith(HEAVY + f"monta um valor com mais de {MAX_VALUE_SIZE} caracteres")
    # The largest string that ever existed is the 100 000-character one (and a few copies of it).
    assert peak < 4 * 1024 * 1024, f"peak {peak} bytes"


BIG = "{% set a = 'x' * 100000 %}"


@GUARD
@pytest.mark.parametrize("source", [
    BIG + "{% set a = a + a %}{{ a|length }}",
    "{% set a = ['x'] * 100000 %}{% set a = a + a %}{{ a|length }}",
    BIG + "{{ (a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a)|length }}",
    BIG + "{{ a ~ [a, a] }}",
    # a list of references to one long string: small in memory, huge as text
    BIG + "{{ [a] * 1000 }}",
    BIG + "{{ [[a] * 1000] * 1000 }}",
    BIG + "{{ ([a] * 1000)|join }}",
    BIG + "{{ ([a] * 1000)|string }}",
    BIG + "{{ ''.join([a] * 1000) }}",
    BIG + "{{ ('%s' * 1000) % ([a] * 1000) }}",
    BIG + "{{ ('%(a)s' * 1000) % {'a': a} }}",
    BIG + "{{ ('%s' * 1000)|format(*([a] * 1000)) }}",
    BIG + "{{ ([a] * 1000)|tojson }}",
    BIG + "{{ ([[a] * 1000] * 1000)|pprint }}",
    BIG + "{{ a|replace('x', a) }}",
    BIG + "{{ a.replace('x', 'yy') }}",
    "{% set a = 'x\n' * 50000 %}{{ a|indent('yyyyyyyyyy') }}",
    "{% set a = 'x\n' * 50000 %}{{ a|indent(1000) }}",
    BIG + "{{ a|wordwrap(1, wrapstring='yyyyyyyyyyyyyyyyyyyy') }}",
    BIG + "{{ a.translate({120: a}) }}",
    BIG + "{{ a|urlize(target='t' * 1000) }}",
    # buffered output: a macro's, a {% set %} block's, a filter block's
    BIG + "{% macro m() %}{% for i in range(1000) %}{{ a }}{% endfor %}{% endmacro %}{{ m()|length }}",
    BIG + "{% set x %}{% for i in range(1000) %}{{ a }}{% endfor %}{% endset %}{{ x|length }}",
    BIG + "{% filter length %}{% for i in range(1000) %}{{ a }}{% endfor %}{% endfilter %}",
    # numbers
    "{% set n = 9 ** 1000 %}{{ n * n * n * n * n * n * n * n }}",
    "{% set ns = namespace(n=3) %}{% for i in range(100) %}{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n }}",
    "{{ [[1] * 1000] * 1000|sum(start=[]) }}",
])
def test_values_that_would_be_too_large_are_refused_before_they_are_built(source: str) -> None:
    for render in (render_text, render_html):
        result, peak = _peak_of(lambda render=render: render(source, {}))
        assert isinstance(result, TemplateError), source
        assert "0x" not in str(result) and "<" not in str(result)
        assert peak < 8 * 1024 * 1024, f"{source}: peak {peak} bytes"


def test_sizes_up_to_the_cap_still_work() -> None:
    half = MAX_VALUE_SIZE // 2
    assert len(render_html(f"{{% set a = 'x' * {half} %}}{{{{ a ~ a }}}}", {})) == MAX_VALUE_SIZE
    assert len(render_html(f"{{% set a = 'x' * {half} %}}{{{{ a + a }}}}", {})) == MAX_VALUE_SIZE
    assert len(render_html("{{ (['ab'] * 1000)|join(', ') }}", {})) == 2 * 1000 + 2 * 999
    with pytest.raises(TemplateError, match=HEAVY):
        render_html(f"{{% set a = 'x' * {half} %}}{{{{ a ~ a ~ 'x' }}}}", {})


# --- internal reprs (point 10) -------------------------------------------------------------------


@RENDERS
@pytest.mark.parametrize("source", [
    "{{ range }}",
    "{{ nome.upper }}",
    "{{ cycler }}",
    "{{ namespace }}",
    "{{ self }}",
    "{{ joiner }}",
    "{{ joiner() }}",
    "{{ dict }}",
    "{{ cycler('a', 'b') }}",
    "{{ namespace(a=1) }}",
    "{% for i in [1] %}{{ loop }}{% endfor %}",
    "{% for i in [1] %}{{ loop.cycle }}{% endfor %}",
    "{% macro m() %}{% endmacro %}{{ m }}",
    "{{ range(3)|map('upper') }}",
    "{{ {'a': 1}.items() }}",
    "{{ 'a'.encode() }}",
    "{{ range(3) }}",
    # the same values turned into text any other way
    "{{ nome.upper ~ '' }}",
    "{{ nome.upper|string }}",
    "{{ nome.upper|e }}",
    "{{ nome.upper|pprint }}",
    "{{ '%s' % nome.upper }}",
    "{{ '%s'|format(nome.upper) }}",
    "{{ [nome.upper]|join }}",
    "{{ [nome, nome.upper] }}",
    "{{ {'k': cycler} }}",
    "{{ [nome if false] }}",
])
def test_internal_values_are_never_printed(render, source: str) -> None:
    with pytest.raises(TemplateError) as excinfo:
        render(source, {"nome": "Ana"})
    message = str(excinfo.value)
    assert _msgid(excinfo.value) == render_module._INTERNAL_VALUE.msgid
    assert message.startswith(INTERNAL) and message.endswith("(linha 1)")
    for leak in ("<", "0x", "function", "method", "class", "Undefined", "jinja2"):
        assert leak not in message


@RENDERS
def test_undefined_values_fail_as_undefined_not_as_a_repr(render) -> None:
    for source in ("{{ lipsum }}", "{{ [nao_existe] }}", "{{ {'a': nao_existe} }}", "{{ nao_existe|string }}",
                   "{{ [nao_existe]|join }}", "{{ 'x' ~ nao_existe }}"):
        with pytest.raises(TemplateError) as excinfo:
            render(source, {})
        assert str(excinfo.value).startswith("undefined variable '"), source
        assert "Undefined" not in str(excinfo.value)
    # the implicit else of a conditional expression is still empty text, as in Jinja
    assert render("[{{ 'x' if false }}]", {}) == "[]"


def test_data_still_prints_as_before() -> None:
    variables = {"nome": "Ana", "itens": ["a", "b"], "d": {"k": 1}}
    assert render_text("{{ itens }} {{ d }} {{ none }} {{ 1.5 }} {{ true }} {{ itens|join(', ') }}", variables) \
        == "['a', 'b'] {'k': 1} None 1.5 True a, b"
    assert render_text("{{ nome.upper() }} {{ range(3)|join(',') }} {{ range(3)|list }}", variables) \
        == "ANA 0,1,2 [0, 1, 2]"


# --- the console: preview (any role) and save ------------------------------------------------------


@GUARD
@pytest.mark.parametrize("client", ["owner", "agent"])
def test_the_preview_of_a_heavy_template_returns_an_error_at_once(client, request) -> None:
    browser = request.getfixturevalue(client)
    token = csrf(browser.get("/admin/").text)
    for body in (NESTED_LOOPS, DOUBLING):
        answer = browser.post("/admin/templates/preview/", data={"body": body}, headers={"X-CSRFToken": token})
        assert answer.status_code == 200
        payload = answer.get_json()
        assert payload["text"] == "" and payload["error"].startswith(HEAVY)


def test_the_preview_shows_no_internal_repr(owner) -> None:  # noqa: F811 - the fixture
    token = csrf(owner.get("/admin/").text)
    for body in ("{{ range }}", "{{ nome.upper }}", "{{ cycler }}", "{{ lipsum }}", "{{ namespace }}", "{{ self }}"):
        payload = owner.post("/admin/templates/preview/", data={"body": body},
                             headers={"X-CSRFToken": token}).get_json()
        assert payload["text"] == ""
        assert "<" not in payload["error"] and "0x" not in payload["error"]
        assert payload["error"].startswith(INTERNAL) or payload["error"].startswith("A variável lipsum não existe")


@GUARD
def test_saving_a_heavy_template_is_refused(owner, tenants, rt) -> None:  # noqa: F811 - the fixtures
    a, _ = tenants
    token = csrf(owner.get("/admin/templates/new/").text)
    base = {"csrf_token": token, "key": "session_reminder", "channel_kind": "email", "locale": "pt_BR"}
    for extra in ({"body": NESTED_LOOPS},
                  {"body": "Olá {{ nome }}", "body_html": "<p>" + NESTED_LOOPS + "</p>"},
                  {"body": "Olá {{ nome }}", "subject": DOUBLING},
                  {"body": "Olá {{ nome.upper }}"}):
        page = owner.post("/admin/templates/new/", data={**base, **extra})
        assert page.status_code == 200
        assert "Erro ao renderizar com dados de exemplo" in page.text
        assert HEAVY in page.text or INTERNAL in page.text
    with rt.db.connect() as conn:
        assert conn.execute(select(templates).where(templates.c.org_id == a.world.org_id,
                                                    templates.c.channel_kind == "email")).first() is None
    # a subject whose variable only exists at send time is still allowed, as before
    saved = owner.post("/admin/templates/new/", data={**base, "body": "Olá {{ nome }}",
                                                      "subject": "{{ codigo_da_campanha }}"})
    assert saved.status_code == 302


# --- send time: the message fails for good -------------------------------------------------------

APPOINTMENT = local(2026, 12, 3, 14, 0)
DUE = local(2026, 12, 2, 14, 0).astimezone(UTC)


@GUARD
@pytest.mark.parametrize("body", [
    "Olá {{ nome }}" + NESTED_LOOPS,
    "Olá {{ nome }}" + DOUBLING,
    "Olá {{ nome.upper }}",
])
def test_a_heavy_template_fails_its_message_permanently_and_the_worker_goes_on(rt, clock, body) -> None:
    world = World(rt)
    world.channel("whatsapp")
    world.channel("sms")
    world.rule(1440, kinds=("whatsapp", "sms"))
    with rt.db.begin() as conn:
        conn.execute(insert(templates).values(org_id=world.org_id, key="session_reminder", channel_kind="whatsapp",
                                              locale="pt_BR", body=body, updated_at=clock.now()))
    ana = world.contact(name="Ana Clara", phone="+5516999887766", consent=("whatsapp",))
    bia = world.contact(name="Beatriz", phone="+5516999880000", consent=("sms",))
    world.appointment(ana, APPOINTMENT)
    world.appointment(bia, APPOINTMENT)
    [heavy] = world.messages(contact_id=ana)
    [fine] = world.messages(contact_id=bia)
    clock.set(DUE)
    assert sorted(dispatch.claim_due(rt, limit=100)) == sorted([heavy.id, fine.id])
    assert dispatch.send_one(rt, heavy.id) == "failed"
    assert dispatch.send_one(rt, fine.id) == "sent"

    row = world.message(heavy.id)
    assert (row.status, row.error_code) == ("failed", "template_error")
    assert row.error_detail.startswith((HEAVY, INTERNAL))
    assert "Ana" not in row.error_detail and "0x" not in row.error_detail
    assert row.body is None
    assert world.events(heavy.id) == ["queued", "claimed", "failed"]
    # Failed for good: no worker claims it again, however late it gets.
    clock.advance(timedelta(days=2))
    assert heavy.id not in dispatch.claim_due(rt, limit=100)
    assert dispatch.send_one(rt, heavy.id) == "not_claimed"
    assert world.events(heavy.id) == ["queued", "claimed", "failed"]
    with rt.db.connect() as conn:
        details = conn.execute(select(message_events.c.detail)
                               .where(message_events.c.message_id == heavy.id)).scalars().all()
    assert all("Ana" not in str(d) for d in details)
    [sent] = world.sandbox()
    assert sent.to_address == "+5516999880000"
