"""What one message render costs and withstands: Lembra's Jinja sandbox against python-liquid 2.

    .venv/bin/python bench/template_engines.py [--rounds 2000] [--guard 10] [--skip-hostile]

python-liquid is an optional measurement dependency (`pip install 'python-liquid>=2,<3'`); without
it the bench says so in one line and exits 0.

Speed: Lembra's real default templates (read from the migrations, applied to a throw-away SQLite
file: every global row's subject and body) and a few clinic-style templates (variables, if/else,
upper/lower/capitalize, an HTML e-mail) are rendered by

- `bare`: a Python function generated from the same template, concatenating the same strings
  (what an f-string does): the least any engine can cost, the bare limit;
- `lembra`: the renderer in use (`render_text`, `render_html`, compile cache included);
- `liquid`: python-liquid 2 with its limits set (loop iterations, output stream, local namespace,
  context depth), parsed templates cached the way Lembra caches its compiled ones; `no-limits`: the
  same with none of them set, to show what the limits cost.

The templates are written once in the Jinja subset clinics use, and migrated mechanically to Liquid
(`_Subset`): Jinja's trim_blocks/lstrip_blocks become plain text, `{% if x %}` becomes
`{% if x != blank %}` (an empty string is true in Liquid), upper/lower become upcase/downcase. All
three outputs are compared on two sets of variables before anything is timed. Rounds interleave the
engines, so a busy neighbour on the machine costs each of them alike. It prints µs per render, p50
and p99.

Hostile cases: every template of tests/test_template_limits.py that is meant to be refused (plus the
sandbox escapes and memory bombs of tests/test_render.py), and its Liquid counterpart where Liquid
can say the same thing, each rendered once in a child process (a wall-clock guard, an address-space
cap) by both engines: how it ended, the time, the peak of Python allocations (tracemalloc).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from markupsafe import escape

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The renderer under test, imported in this one place.
from engine.messaging import render as lembra  # noqa: E402
from engine.store.migrate import upgrade  # noqa: E402

try:
    import liquid
    from liquid import StrictUndefined
    from liquid.exceptions import LiquidError, ResourceLimitError
except ImportError:  # optional: the bench says so and exits 0
    liquid = None  # type: ignore[assignment]

#: Liquid's limits. Loop iterations: ten times Lembra's largest range() (a 1 000-row table in an
#: e-mail must render, tests/test_template_limits.py), counted by Liquid as the product of the nested
#: loops' lengths, before the loop starts. Output: Lembra's caps (Liquid counts UTF-8 bytes, Lembra
#: characters). Local namespace (sys.getsizeof of every assigned value, summed): room for Lembra's
#: largest value (MAX_VALUE_SIZE characters) even at 4 bytes a character. Context depth: the default.
LOOP_LIMIT = 10 * 1_000
NAMESPACE_LIMIT = 4 * lembra.MAX_VALUE_SIZE
CONTEXT_DEPTH_LIMIT = 30

#: Extra address space a hostile case's child may take (the machine has no swap: a case that tries
#: to build 10 GB must fail with MemoryError here, not push the host out of memory).
CHILD_EXTRA_BYTES = 512 * 1024 * 1024


# --- the two engines ------------------------------------------------------------------------------


def _liquid_environments() -> tuple[Any, Any]:
    """The text and HTML environments, with every limit Liquid has set."""

    class _Limited(liquid.Environment):
        loop_iteration_limit = LOOP_LIMIT
        local_namespace_limit = NAMESPACE_LIMIT
        context_depth_limit = CONTEXT_DEPTH_LIMIT
        # Jinja prints a block that holds only whitespace; Liquid would drop it.
        suppress_blank_control_flow_blocks = False

    class _Text(_Limited):
        output_stream_limit = lembra.MAX_TEXT_OUTPUT

    class _Html(_Limited):
        output_stream_limit = lembra.MAX_HTML_OUTPUT

    return _Text(undefined=StrictUndefined), _Html(undefined=StrictUndefined, autoescape=True)


@dataclass(frozen=True)
class Engines:
    """Liquid's render functions, each `(source, variables) -> str`."""

    liquid_text: Callable[[str, Mapping[str, object]], str]
    liquid_html: Callable[[str, Mapping[str, object]], str]


def _liquid_engines(loader: Any = None, *, limits: bool = True) -> Engines:
    if limits:
        text_env, html_env = _liquid_environments()
    else:  # what the limits cost: the same engine with none of them
        text_env = liquid.Environment(undefined=StrictUndefined)
        html_env = liquid.Environment(undefined=StrictUndefined, autoescape=True)
        text_env.suppress_blank_control_flow_blocks = html_env.suppress_blank_control_flow_blocks = False
    if loader is not None:
        text_env.loader = html_env.loader = loader
    # Parsed templates cached like Lembra's compiled ones (functools.lru_cache on the source).
    parse_text = functools.lru_cache(maxsize=512)(text_env.from_string)
    parse_html = functools.lru_cache(maxsize=512)(html_env.from_string)
    return Engines(
        liquid_text=lambda source, variables: parse_text(source).render(variables),
        liquid_html=lambda source, variables: parse_html(source).render(variables),
    )


# --- the Jinja subset clinics write, and its migration ---------------------------------------------

_TAG = re.compile(r"{{\s*(.*?)\s*}}|{%\s*(.*?)\s*%}", re.DOTALL)
_NAME = r"[a-z_][a-z0-9_]*"
_VAR = re.compile(rf"^({_NAME})((?:\s*\|\s*{_NAME})*)$")
_IF = re.compile(rf"^if\s+({_NAME})(?:\s*(==|!=)\s*'([^']*)')?$")
_FILTERS = {"upper": ("upcase", "upper"), "lower": ("downcase", "lower"), "capitalize": ("capitalize", "capitalize")}


class _Subset:
    """A template in the subset: text, `{{ name|filter }}`, `{% if name [== 'x'] %}`, else, endif.

    Parsed with Lembra's whitespace rules (lstrip_blocks: blanks before a block tag at a line's
    start go; trim_blocks: the newline right after a block tag goes), so both the Liquid source and
    the bare function come out with the exact text a patient reads."""

    def __init__(self, source: str) -> None:
        source = re.sub(r"(?m)^[ \t]+(?={%)", "", source)
        self.parts: list[tuple[str, ...]] = []
        at = 0
        for match in _TAG.finditer(source):
            if match.start() > at:
                self.parts.append(("text", source[at:match.start()]))
            at = match.end()
            if match.group(1) is not None:
                var = _VAR.match(match.group(1))
                if var is None:
                    raise ValueError(f"outside the subset: {match.group(0)!r}")
                filters = tuple(f.strip() for f in var.group(2).split("|") if f.strip())
                self.parts.append(("var", var.group(1), *filters))
                continue
            tag = match.group(2)
            if source.startswith("\n", at):
                at += 1
            if tag in ("else", "endif"):
                self.parts.append((tag,))
                continue
            cond = _IF.match(tag)
            if cond is None:
                raise ValueError(f"outside the subset: {match.group(0)!r}")
            self.parts.append(("if", cond.group(1), cond.group(2) or "", cond.group(3) or ""))
        if at < len(source):
            self.parts.append(("text", source[at:]))

    def liquid(self) -> str:
        """The Liquid source that renders the same text."""
        out = []
        for part in self.parts:
            kind = part[0]
            if kind == "text":
                out.append(part[1])
            elif kind == "var":
                out.append("{{ " + " | ".join((part[1], *(_FILTERS[f][0] for f in part[2:]))) + " }}")
            elif kind == "if":
                _, name, op, literal = part
                # Liquid: only nil and false are false; Jinja's `if x` is false for "" too.
                out.append(f"{{% if {name} {op} {json.dumps(literal)} %}}" if op else f"{{% if {name} != blank %}}")
            else:
                out.append(f"{{% {kind} %}}")
        return "".join(out)

    def bare(self, *, html: bool) -> Callable[[Mapping[str, object]], str]:
        """A Python function concatenating the same strings: the bare limit."""
        code, end = self._expression(0, (), html)
        assert end == len(self.parts)
        return eval(compile(f"lambda v: {code}", "<bare>", "eval"), {"escape": escape})

    def _expression(self, i: int, stop: tuple[str, ...], html: bool) -> tuple[str, int]:
        terms: list[str] = []
        while i < len(self.parts) and self.parts[i][0] not in stop:
            part = self.parts[i]
            if part[0] == "text":
                terms.append(repr(part[1]))
                i += 1
            elif part[0] == "var":
                term = f"v[{part[1]!r}]" + "".join(f".{_FILTERS[f][1]}()" for f in part[2:])
                terms.append(f"str(escape({term}))" if html else term)
                i += 1
            else:
                _, name, op, literal = part
                cond = f"v[{name!r}] {op} {literal!r}" if op else f"v[{name!r}]"
                then, i = self._expression(i + 1, ("else", "endif"), html)
                other = "''"
                if self.parts[i][0] == "else":
                    other, i = self._expression(i + 1, ("endif",), html)
                terms.append(f"(({then}) if {cond} else ({other}))")
                i += 1  # endif
        return (" + ".join(terms) or "''"), i


# --- the templates timed ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One template, in Jinja (as stored) and migrated to Liquid, with its bare function."""

    name: str
    jinja: str
    html: bool
    group: str

    @functools.cached_property
    def subset(self) -> _Subset:
        return _Subset(self.jinja)


CLINIC_TEMPLATES: dict[str, tuple[str, bool]] = {
    "clinic: variables only": (
        "Oi {{ nome }}, lembrete da sua consulta {{ data }} às {{ hora }} com {{ profissional }}. {{ clinica }}",
        False),
    "clinic: if/else on modalidade": ((
        "Olá, {{ nome }}!\n"
        "{% if modalidade == 'Online' %}\n"
        "Sua consulta online é {{ data_completa }}, às {{ hora }}. O link chega 10 minutos antes.\n"
        "{% else %}\n"
        "Sua consulta é {{ data_completa }}, às {{ hora }}{% if local %}, em {{ local }}{% endif %}.\n"
        "{% endif %}\n"
        "Responda OK para confirmar ou CANCELAR para desmarcar.\n\n{{ clinica }}"),
        False),
    "clinic: filters": ((
        "{{ nome|upper }}, a {{ clinica|upper }} lembra: {{ dia_semana|capitalize }}, {{ data }}, {{ hora }}."
        "{% if profissional %} Com {{ profissional }}.{% endif %} {{ modalidade|lower }}"),
        False),
    "clinic: HTML e-mail": ((
        "<p>Olá, <b>{{ nome }}</b>!</p>\n<p>Sua sessão com {{ profissional }} é {{ data_completa }}, às "
        "{{ hora }}.</p>\n{% if local %}\n<p>Local: {{ local }}</p>\n{% endif %}\n<p>{{ clinica }}</p>"),
        True),
}


def default_templates() -> list[tuple[str, str | None, str, str | None]]:
    """(key/kind, subject, body, body_html) of every global default, as the migrations leave them."""
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "defaults.db")
        upgrade(f"sqlite:///{path}")
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT key, channel_kind, subject, body, body_html FROM templates "
                                "WHERE org_id IS NULL ORDER BY key, channel_kind").fetchall()
    return [(f"{key}/{kind}", subject, body, html) for key, kind, subject, body, html in rows]


def cases() -> list[Case]:
    """The defaults' subjects, bodies and HTML bodies, then the clinic-style templates."""
    found: list[Case] = []
    for name, subject, body, body_html in default_templates():
        group = "default: session_reminder/whatsapp" if name == "session_reminder/whatsapp" else "defaults: all"
        found.append(Case(f"{name} body", body, False, group))
        if subject:
            found.append(Case(f"{name} subject", subject, False, "defaults: all"))
        if body_html:
            found.append(Case(f"{name} html", body_html, True, "defaults: all"))
    found += [Case(name, source, html, name) for name, (source, html) in CLINIC_TEMPLATES.items()]
    return found


def variable_sets() -> list[dict[str, object]]:
    """The preview's sample data, and an online appointment with no address (the else branches)."""
    online = lembra.reminder_variables(contact_name="João da Silva", professional="Dr. Paulo Reis",
                                       starts_at=datetime(2026, 3, 23, 12, 30, tzinfo=UTC),
                                       timezone="America/Sao_Paulo", mode="online", location=None,
                                       org_name="Clínica <Sorriso> & Cia")
    return [{**lembra.SAMPLE_VARIABLES, "link_descadastro": ""}, {**online, "link_descadastro": ""}]


def _percentile(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def run_speed(rounds: int) -> None:
    """Check that the three engines agree, then time them and print the table."""
    engines = _liquid_engines()
    unlimited = _liquid_engines(limits=False)
    todo = cases()
    sets = variable_sets()
    contenders: list[tuple[str, Callable[[Case], Callable[[Mapping[str, object]], str]]]] = [
        ("bare", lambda c: c.subset.bare(html=c.html)),
        ("lembra", lambda c: functools.partial(lembra.render_html if c.html else lembra.render_text, c.jinja)),
        ("liquid", lambda c: functools.partial(engines.liquid_html if c.html else engines.liquid_text,
                                               c.subset.liquid())),
        ("liquid_nolimits", lambda c: functools.partial(unlimited.liquid_html if c.html else unlimited.liquid_text,
                                                        c.subset.liquid())),
    ]
    calls = {(name, case.name): make(case) for case in todo for name, make in contenders}
    same = 0
    for case in todo:
        for variables in sets:
            outputs = {name: calls[(name, case.name)](variables) for name, _ in contenders}
            if len(set(outputs.values())) == 1:
                same += 1
            else:
                print(f"  outputs differ: {case.name}: {outputs}")
    print(f"templates: {len(todo)} ({sum(c.group.startswith('default') for c in todo)} from the migrations' "
          f"defaults, {len(CLINIC_TEMPLATES)} clinic-style); identical output in all three engines: "
          f"{same}/{len(todo) * len(sets)} (template × variables)")

    samples: dict[tuple[str, str], list[int]] = {}
    clock = time.perf_counter_ns
    for _ in range(20):  # warm the caches
        for case in todo:
            for name, _ in contenders:
                calls[(name, case.name)](sets[0])
    for n in range(rounds):
        variables = sets[n % 2]
        for case in todo:
            for name, _ in contenders:
                call = calls[(name, case.name)]
                start = clock()
                call(variables)
                samples.setdefault((case.group, name), []).append(clock() - start)

    print(f"\nµs per render, {rounds} rounds (each template once per round, engines interleaved)")
    header = (f"{'templates':38} {'bare p50':>9} {'p99':>7} {'lembra p50':>11} {'p99':>7} "
              f"{'liquid p50':>11} {'p99':>7} {'liquid/lembra':>14} {'no-limits p50':>14} {'p99':>7}")
    print(header)
    groups = list(dict.fromkeys(case.group for case in todo))
    for group in groups:
        row = {name: (_percentile(samples[(group, name)], 0.5), _percentile(samples[(group, name)], 0.99))
               for name, _ in contenders}
        print(f"{group:38} {row['bare'][0]:9.1f} {row['bare'][1]:7.1f} {row['lembra'][0]:11.1f} "
              f"{row['lembra'][1]:7.1f} {row['liquid'][0]:11.1f} {row['liquid'][1]:7.1f} "
              f"{row['liquid'][0] / row['lembra'][0]:13.2f}x {row['liquid_nolimits'][0]:14.1f} "
              f"{row['liquid_nolimits'][1]:7.1f}")


# --- the hostile cases -------------------------------------------------------------------------------

NESTED_J = "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
NESTED_L = "{% for i in (1..1000) %}{% for j in (1..1000) %}{% endfor %}{% endfor %}"
BIG_J = "{% set a = 'x' * 100000 %}"
#: 'x' * 100000 in Liquid, which has no string repetition: fourteen doublings, then a slice.
BIG_L = ("{% assign a = 'xxxxxxxxxx' %}" + "{% assign a = a | append: a %}" * 14
         + "{% assign a = a | slice: 0, 100000 %}")
DOUBLING_J = BIG_J + "{% set a = a ~ a %}" * 8 + "{{ a|length }}"
NO_MACROS = "no macros in Liquid"


@dataclass(frozen=True)
class Hostile:
    """A template Lembra must refuse, and what a clinic could write in Liquid to the same end."""

    test: str
    jinja: str
    liquid: str | None  # None: Liquid cannot express it (`why` says what is missing)
    why: str = ""
    html: bool = False
    loader: dict[str, str] | None = None  # templates a Liquid loader would serve (Lembra gives none)


HOSTILE: list[Hostile] = [
    # tests/test_template_limits.py: CPU
    Hostile("heavy_loops", NESTED_J, NESTED_L),
    Hostile("heavy_loops", NESTED_J.replace("{% endfor %}", "{% for k in range(1000) %}{% endfor %}{% endfor %}", 1),
            NESTED_L.replace("{% endfor %}", "{% for k in (1..1000) %}{% endfor %}{% endfor %}", 1)),
    Hostile("heavy_loops", "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
            BIG_L + "{% assign c = a | split: '' %}{% for x in c %}{% for y in c %}{% endfor %}{% endfor %}"),
    Hostile("heavy_loops", "{% set x %}" + NESTED_J + "{% endset %}",
            "{% capture x %}" + NESTED_L + "{% endcapture %}"),
    Hostile("heavy_loops", "{% macro m() %}" + NESTED_J + "{% endmacro %}{{ m() }}", None, NO_MACROS),
    Hostile("heavy_loops", "{% filter upper %}" + NESTED_J + "{% endfilter %}", None, "no filter blocks in Liquid"),
    Hostile("heavy_loops",
            "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
            "{% render 'f' %}", "no macros; recursion needs {% render %} and a loader, which Lembra would not "
            "configure: shown with one", loader={"f": "{% render 'f' %}{% render 'f' %}"}),
    Hostile("heavy_loops", BIG_J + "{% for x in [1] recursive %}{% if x == 1 %}{{ loop(a) }}{% endif %}{% endfor %}",
            None, "no recursive loops in Liquid"),
    Hostile("heavy_loops", "{% for i in range(1000) %}{{ range(1000)|map('string')|join|length }}{% endfor %}",
            "{% for i in (1..1000) %}{{ (1..1000) | join: '' | size }}{% endfor %}"),
    Hostile("heavy_loops",
            "{% set c = cycler(*range(1000)) %}{% for i in range(1000) %}{% for j in range(1000) %}{% if c.next() %}"
            "{% endif %}{% endfor %}{% endfor %}",
            "{% for i in (1..1000) %}{% for j in (1..1000) %}{% capture c %}{% cycle 'a', 'b' %}{% endcapture %}"
            "{% endfor %}{% endfor %}"),
    Hostile("heavy_loops", NESTED_J.replace("{% endfor %}", "{% if loop.length %}{% endif %}{% endfor %}", 1),
            NESTED_L.replace("{% endfor %}", "{% if forloop.length %}{% endif %}{% endfor %}", 1)),
    # tests/test_template_limits.py: volume (html, as in the test)
    Hostile("volume", BIG_J + "{% for i in range(1000) %}{% for j in range(1000) %}{% if a.count('y') %}{% endif %}"
            "{% endfor %}{% endfor %}",
            BIG_L + "{% for i in (1..1000) %}{% for j in (1..1000) %}{% if a contains 'y' %}{% endif %}{% endfor %}"
            "{% endfor %}", html=True),
    Hostile("volume, at Liquid's loop limit", BIG_J + "{% for i in range(1000) %}{% for j in range(1000) %}"
            "{% if a.count('y') %}{% endif %}{% endfor %}{% endfor %}",
            BIG_L + "{% for i in (1..10000) %}{% if a contains 'y' %}{% endif %}{% endfor %}", html=True),
    Hostile("volume", "{% set l = ['x'] * 100000 %}{% for i in range(1000) %}{% for j in range(1000) %}"
            "{% if 'z' in l %}{% endif %}{% endfor %}{% endfor %}",
            BIG_L + "{% assign l = a | split: '' %}{% for i in (1..1000) %}{% for j in (1..1000) %}"
            "{% if l contains 'z' %}{% endif %}{% endfor %}{% endfor %}", html=True),
    Hostile("volume", BIG_J + "{% for i in range(1000) %}{% for j in range(1000) %}{% if a[1:] %}{% endif %}"
            "{% endfor %}{% endfor %}",
            BIG_L + "{% for i in (1..1000) %}{% for j in (1..1000) %}{% assign t = a | slice: 1, 99999 %}{% endfor %}"
            "{% endfor %}", html=True),
    Hostile("volume, at Liquid's loop limit", BIG_J + "{% for i in range(1000) %}{% for j in range(1000) %}"
            "{% if a[1:] %}{% endif %}{% endfor %}{% endfor %}",
            BIG_L + "{% for i in (1..10000) %}{% assign t = a | slice: 1, 99999 %}{% endfor %}", html=True),
    Hostile("volume", "{% set l = ['x'] * 100000 %}{% for i in range(1000) %}{% if l|sort %}{% endif %}{% endfor %}",
            BIG_L + "{% assign l = a | split: '' %}{% for i in (1..1000) %}{% assign t = l | sort %}{% endfor %}",
            html=True),
    Hostile("volume", "{% set a = 'x ' * 50000 %}{% for i in range(1000) %}{% if a|wordwrap(1) %}{% endif %}"
            "{% endfor %}", None, "no wordwrap filter in Liquid", html=True),
    Hostile("volume", BIG_J + "{% for i in range(1000) %}{% if a|upper %}{% endif %}{% endfor %}",
            BIG_L + "{% for i in (1..1000) %}{% assign t = a | upcase %}{% endfor %}", html=True),
    Hostile("volume, at Liquid's loop limit", BIG_J + "{% for i in range(1000) %}{% if a|upper %}{% endif %}"
            "{% endfor %}", BIG_L + "{% for i in (1..10000) %}{% assign t = a | upcase %}{% endfor %}", html=True),
    # tests/test_template_limits.py: memory
    Hostile("doubling bomb", DOUBLING_J, BIG_L + "{% assign a = a | append: a %}" * 8 + "{{ a | size }}"),
    Hostile("too large", BIG_J + "{% set a = a + a %}{{ a|length }}",
            BIG_L + "{% assign a = a | append: a %}{{ a | size }}"),
    Hostile("too large", "{% set a = ['x'] * 100000 %}{% set a = a + a %}{{ a|length }}",
            BIG_L + "{% assign l = a | split: '' %}{% assign l = l | concat: l %}{{ l | size }}"),
    Hostile("too large", BIG_J + "{{ (a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a ~ a)|length }}",
            BIG_L + "{{ a" + " | append: a" * 9 + " | size }}"),
    Hostile("too large", BIG_J + "{{ a ~ [a, a] }}", None, "no list literals in Liquid"),
    Hostile("too large", BIG_J + "{{ [a] * 1000 }}", None, "no list repetition in Liquid"),
    Hostile("too large", BIG_J + "{{ [[a] * 1000] * 1000 }}", None, "no list repetition in Liquid"),
    Hostile("too large", BIG_J + "{{ ([a] * 1000)|join }}", BIG_L + "{{ (1..1000) | join: a | size }}"),
    Hostile("too large", BIG_J + "{{ ([a] * 1000)|string }}", None, "no list repetition in Liquid"),
    Hostile("too large", BIG_J + "{{ ''.join([a] * 1000) }}", None, "no methods in Liquid (join: row above)"),
    Hostile("too large", BIG_J + "{{ ('%s' * 1000) % ([a] * 1000) }}", None, "no % operator in Liquid"),
    Hostile("too large", BIG_J + "{{ ('%(a)s' * 1000) % {'a': a} }}", None, "no % operator in Liquid"),
    Hostile("too large", BIG_J + "{{ ('%s' * 1000)|format(*([a] * 1000)) }}", None, "no format filter in Liquid"),
    Hostile("too large", BIG_J + "{{ ([a] * 1000)|tojson }}", None, "no tojson filter in Liquid"),
    Hostile("too large", BIG_J + "{{ ([[a] * 1000] * 1000)|pprint }}", None, "no pprint filter in Liquid"),
    Hostile("too large", BIG_J + "{{ a|replace('x', a) }}", BIG_L + "{{ a | replace: 'x', a | size }}"),
    Hostile("too large", BIG_J + "{{ a.replace('x', 'yy') }}", BIG_L + "{{ a | replace: 'x', 'yy' | size }}"),
    Hostile("too large", "{% set a = 'x\n' * 50000 %}{{ a|indent('yyyyyyyyyy') }}", None, "no indent filter"),
    Hostile("too large", "{% set a = 'x\n' * 50000 %}{{ a|indent(1000) }}", None, "no indent filter"),
    Hostile("too large", BIG_J + "{{ a|wordwrap(1, wrapstring='yyyyyyyyyyyyyyyyyyyy') }}", None, "no wordwrap filter"),
    Hostile("too large", BIG_J + "{{ a.translate({120: a}) }}", None, "no methods in Liquid"),
    Hostile("too large", BIG_J + "{{ a|urlize(target='t' * 1000) }}", None, "no urlize filter"),
    Hostile("too large", BIG_J + "{% macro m() %}{% for i in range(1000) %}{{ a }}{% endfor %}{% endmacro %}"
            "{{ m()|length }}", None, NO_MACROS),
    Hostile("too large", BIG_J + "{% set x %}{% for i in range(1000) %}{{ a }}{% endfor %}{% endset %}{{ x|length }}",
            BIG_L + "{% capture x %}{% for i in (1..1000) %}{{ a }}{% endfor %}{% endcapture %}{{ x | size }}"),
    Hostile("too large", BIG_J + "{% filter length %}{% for i in range(1000) %}{{ a }}{% endfor %}{% endfilter %}",
            None, "no filter blocks in Liquid"),
    Hostile("too large", "{% set n = 9 ** 1000 %}{{ n * n * n * n * n * n * n * n }}", None,
            "no power operator (big numbers: next row)"),
    Hostile("too large", "{% set ns = namespace(n=3) %}{% for i in range(100) %}{% set ns.n = ns.n * ns.n %}"
            "{% endfor %}{{ ns.n }}",
            "{% assign n = 3 %}{% for i in (1..100) %}{% assign n = n | times: n %}{% endfor %}{{ n }}"),
    Hostile("too large", "{{ [[1] * 1000] * 1000|sum(start=[]) }}", None, "no list repetition in Liquid"),
    # Not in the tests (Jinja's version is counted like the rows above): under Liquid's loop limit,
    # each iteration may still do any amount of work on values under its namespace limit.
    Hostile("extra: heavy work per iteration",
            BIG_J + "{% for i in range(100) %}{% for j in range(100) %}{% if a|list|sort|join %}{% endif %}"
            "{% endfor %}{% endfor %}",
            BIG_L + "{% for i in (1..100) %}{% for j in (1..100) %}{% assign t = a | split: '' | sort | join: '' %}"
            "{% endfor %}{% endfor %}"),
    # tests/test_render.py: memory bombs that Liquid can say
    Hostile("memory bombs (test_render)", "{% for i in range(10**9) %}{% endfor %}",
            "{% for i in (1..1000000000) %}{% endfor %}"),
    Hostile("memory bombs (test_render)", "{{ nome.replace('', 'x' * 50000).replace('', 'x' * 50000) }}",
            "{% assign b = 'xxxxxxxxxx' %}" + "{% assign b = b | append: b %}" * 13
            + "{% assign b = b | slice: 0, 50000 %}{{ nome | replace: '', b | replace: '', b | size }}"),
]

#: Printed as is by Liquid: Jinja sources of tests/test_template_limits.py (internal values) and
#: tests/test_render.py (sandbox escapes), and Liquid's own internal objects.
PROBES_J = [
    "{{ range }}", "{{ nome.upper }}", "{{ cycler }}", "{{ namespace }}", "{{ self }}", "{{ joiner }}",
    "{{ joiner() }}", "{{ dict }}", "{% for i in [1] %}{{ loop }}{% endfor %}",
    "{% macro m() %}{% endmacro %}{{ m }}", "{{ {'a': 1}.items() }}", "{{ range(3) }}",
    "{{ ''.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}", "{{ nome.upper.__self__ }}",
    "{{ nome|attr('__class__') }}", "{{ nome['__class__'] }}", "{{ '{0.__class__}'.format(nome) }}",
    "{{ lipsum }}",
]
PROBES_L = [
    "{% for i in (1..2) %}{{ forloop }}{% endfor %}", "{% tablerow i in (1..1) %}{{ tablerowloop }}{% endtablerow %}",
    "{{ (1..3) }}", "{{ nome.upcase }}", "{{ nome['__class__'] }}", "{{ nome.__class__.__mro__ }}",
    "{{ nome | split: '' }}", "{% cycle 'a' %}{{ cycle }}", "{{ empty }}{{ blank }}",
]


def _one(engine: str, source: str, html: bool, loader: dict[str, str] | None) -> dict[str, Any]:
    """Render once timed, once more under tracemalloc; how it ended, ms, peak bytes."""
    if engine == "lembra":
        render = lembra.render_html if html else lembra.render_text
    else:
        liquids = _liquid_engines(liquid.DictLoader(loader) if loader else None)
        render = liquids.liquid_html if html else liquids.liquid_text

    def attempt() -> str:
        try:
            out = render(source, {"nome": "Ana"})
        except MemoryError:
            return "MemoryError (the bench's address-space cap)"
        except Exception as exc:  # noqa: BLE001 - how it ended is the measurement
            if engine == "lembra":
                return "refused: " + str(exc).split(":")[0][:60]
            kind = "stopped" if isinstance(exc, ResourceLimitError) else "error"
            message = str(exc.message if isinstance(exc, LiquidError) else exc).splitlines()[0][:50]
            return f"{kind}: {type(exc).__name__} ({message})"
        return f"rendered {len(out)} chars: {out[:24]!r}"

    start = time.perf_counter()
    outcome = attempt()
    elapsed = time.perf_counter() - start
    tracemalloc.start()
    try:
        attempt()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return {"outcome": outcome, "ms": elapsed * 1000, "peak": peak}


def _child(index: int, engine: str) -> None:
    # Cap the address space a little above what the imports took: a case that tries to build
    # gigabytes gets MemoryError instead of the host's memory.
    with open("/proc/self/status") as status:
        vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + CHILD_EXTRA_BYTES, vm + CHILD_EXTRA_BYTES))
    if index >= 0:
        case = HOSTILE[index]
        source = case.jinja if engine == "lembra" else case.liquid
        print(json.dumps(_one(engine, source, case.html, case.loader if engine == "liquid" else None)))
    else:
        probes = PROBES_J + PROBES_L if engine == "liquid" else PROBES_J
        print(json.dumps([_one(engine, probe, False, None) for probe in probes]))


def _in_child(index: int, engine: str, guard: float) -> Any:
    command = [sys.executable, __file__, "--child", str(index), "--engine", engine]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=guard, check=False)
    except subprocess.TimeoutExpired:
        return {"outcome": f"still running at {guard:g} s: killed", "ms": guard * 1000, "peak": None}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"outcome": f"child died ({done.returncode}): {last[:60]}", "ms": None, "peak": None}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(result: dict[str, Any]) -> str:
    ms = "-" if result["ms"] is None else f"{result['ms']:.1f} ms"
    peak = "-" if result["peak"] is None else f"{result['peak'] / 1024 / 1024:.1f} MiB"
    return f"{result['outcome']} | {ms} | {peak}"


def run_hostile(guard: float) -> None:
    """Each hostile case in Lembra and in Liquid, each in its own child process."""
    print(f"\nhostile cases: each render in a child process (guard {guard:g} s, address space capped at "
          f"+{CHILD_EXTRA_BYTES // 2**20} MiB); outcome | wall time of one render | tracemalloc peak")
    print("| # | test | Liquid source (abridged) | Lembra | Liquid |")
    print("|---|---|---|---|---|")
    tally: dict[str, int] = {}
    refused = 0
    for index, case in enumerate(HOSTILE):
        mine = _in_child(index, "lembra", guard)
        refused += mine["outcome"].startswith("refused")
        if case.liquid is None:
            tally["no Liquid counterpart"] = tally.get("no Liquid counterpart", 0) + 1
            print(f"| {index + 1} | {case.test} | ({case.why}) | {_cell(mine)} | - |")
            continue
        theirs = _in_child(index, "liquid", guard)
        kind = {"still": "killed at the guard", "MemoryError": "MemoryError at the cap"}.get(
            theirs["outcome"].split()[0], theirs["outcome"].split()[0].rstrip(":"))
        tally[kind] = tally.get(kind, 0) + 1
        shown = case.liquid.replace(BIG_L, "{BIG} ").replace("|", "\\|")
        if len(shown) > 90:
            shown = shown[:87] + "..."
        note = f" ({case.why})" if case.why else ""
        print(f"| {index + 1} | {case.test} | `{shown}`{note} | {_cell(mine)} | {_cell(theirs)} |")
    print(f"Lembra refused {refused} of {len(HOSTILE)}; Liquid outcomes: "
          + ", ".join(f"{kind}: {n}" for kind, n in sorted(tally.items())))
    print("({BIG} = 'x' * 100000 built with 14 appends and a slice, Liquid having no string repetition)")

    mine = _in_child(-1, "lembra", guard)
    theirs = _in_child(-1, "liquid", guard)
    print("\ninternal values and sandbox escapes, printed as is: outcome in Lembra | in Liquid")
    for n, probe in enumerate(PROBES_J + PROBES_L):
        left = mine[n]["outcome"] if isinstance(mine, list) and n < len(PROBES_J) else "-"
        right = theirs[n]["outcome"] if isinstance(theirs, list) else theirs["outcome"]
        print(f"  {probe[:60]:60} | {left[:50]:50} | {right}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--guard", type=float, default=10.0, help="seconds a hostile render may take")
    parser.add_argument("--skip-hostile", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=("lembra", "liquid"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if liquid is None or not liquid.__version__.startswith("2."):
        print("python-liquid 2 is not installed (pip install 'python-liquid>=2,<3'): nothing to compare, skipped")
        return 0
    if args.child is not None:
        _child(args.child, args.engine)
        return 0
    print(f"python {sys.version.split()[0]}, jinja2 {__import__('jinja2').__version__}, "
          f"python-liquid {liquid.__version__}; Liquid limits: loop iterations {LOOP_LIMIT}, output "
          f"{lembra.MAX_TEXT_OUTPUT}/{lembra.MAX_HTML_OUTPUT} bytes (text/HTML), local namespace "
          f"{NAMESPACE_LIMIT} bytes, context depth {CONTEXT_DEPTH_LIMIT}")
    run_speed(args.rounds)
    if not args.skip_hostile:
        run_hostile(args.guard)
    return 0


if __name__ == "__main__":
    sys.exit(main())
