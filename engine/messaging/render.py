"""Render clinic-authored message templates (Jinja2 syntax) safely.

Templates are written by clinic staff in the admin and are therefore
untrusted: they are rendered in a sandbox with strict undefined variables
and with a bound on everything one render may do, the same in the console's
preview, on save and at send time:

- the source (:data:`MAX_SOURCE_LENGTH`) and the output
  (:data:`MAX_TEXT_OUTPUT`, :data:`MAX_HTML_OUTPUT`);
- every value built during the render (:data:`MAX_VALUE_SIZE` characters or
  items). Operations that can multiply a size from a short template (``~``,
  ``+``, ``*``, ``%``, ``join``, ``replace``, ``indent``, ``wordwrap``, the
  text of a list, a macro's output) are checked *before* they build anything,
  every other one right after;
- the work of the whole render, counted: :data:`MAX_RENDER_STEPS` steps (a
  loop iteration, a call, a filter, a test, an operator, a comparison, an
  output) and :data:`MAX_RENDER_VOLUME` units of data read or built by all of
  them together; and :data:`MAX_RENDER_CPU_SECONDS` of the thread's CPU time,
  checked from the same hooks, as a backstop for anything the counters miss.

The counting happens in the sandbox's hooks (``call``, ``call_binop``, the
wrapped filter and test tables, ``finalize``, ``concat``) and in hooks that
the code generator puts around every ``for`` iterable, ``~``, comparison and
slice (:class:`_Instrument`), so a render cannot step around them. Going past
a bound is a :class:`TemplateError` whose :attr:`~TemplateError.text` reads
"Modelo pesado demais: …".

Values that are not data (functions, methods, classes, generators, the loop,
``cycler``, ``namespace`` or ``self`` objects, undefined values inside a list)
are never turned into text: printing one is a :class:`TemplateError`, so an
internal repr such as ``<function … at 0x…>`` never reaches a preview or a
patient.

:class:`TemplateError` messages name the problem (undefined variable, syntax
error, line number) but never a variable's value: the values are patient
data and error messages end up in logs and admin screens.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jinja2
import jinja2.sandbox
from babel import Locale, UnknownLocaleError
from babel.dates import DateTimePattern, format_date, format_datetime, format_time, match_skeleton
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context, LoopContext, Undefined, markup_join, str_join
from jinja2.utils import pass_eval_context
from jinja2.visitor import NodeTransformer

from engine.words.texts import N_, Text

__all__ = [
    "MAX_HTML_OUTPUT",
    "MAX_RENDER_CPU_SECONDS",
    "MAX_RENDER_STEPS",
    "MAX_RENDER_VOLUME",
    "MAX_SOURCE_LENGTH",
    "MAX_TEXT_OUTPUT",
    "MAX_VALUE_SIZE",
    "SAMPLE_VARIABLES",
    "TemplateError",
    "reminder_variables",
    "render_html",
    "render_text",
    "validate",
]

MAX_SOURCE_LENGTH = 10_000
MAX_TEXT_OUTPUT = 4096
# HTML (e-mail) bodies carry markup, so they get a roomier cap; it exists for
# the same reason as the text one: stopping runaway loops.
MAX_HTML_OUTPUT = 100_000

#: Characters (or items of a list) of any one value built inside a render: as
#: large as the largest output, so that {{ 'x' * 10**9 }} or a few nested
#: ``~`` doublings fail before allocating more than that.
MAX_VALUE_SIZE = MAX_HTML_OUTPUT

#: Steps of one render: loop iterations, calls, filters, tests, operators,
#: comparisons and outputs. The default reminders take under 20; a loop over
#: the largest range() with a dozen expressions inside fits; two nested
#: range(1000) loops (a million iterations) do not.
MAX_RENDER_STEPS = 50_000

#: Data units one render may read or build, all operations together: a
#: character or list item handled in C costs 1, one handled item by item in
#: Python (the text of a list, map/select/sort, wordwrap…) costs 10. Fifty
#: times the largest output; it stops a loop that re-reads a huge value on
#: every iteration, which the step count alone would let cost seconds.
MAX_RENDER_VOLUME = 5_000_000

#: CPU seconds of the rendering thread, checked every few dozen steps: a
#: backstop; the counters above stop every known heavy template first.
MAX_RENDER_CPU_SECONDS = 1.0

_MAX_INT_ARGUMENT = 10_000
_MAX_RANGE = 1_000
_MAX_INT_BITS = 4_096
# Texts that a filter inserts once per line or per link (urlize's target,
# truncate's end, trim's characters...): nothing a message needs is longer.
_MAX_TEXT_ARGUMENT = 100
_DEADLINE_EVERY = 64
_PYTHON_WEIGHT = 10

# Jinja gives templates built from strings this pseudo file name; it is how
# the template line is found in a runtime traceback.
_TEMPLATE_FILENAME = "<template>"

# str methods that can expand a short string into a huge one from a tiny
# argument, and which message templates have no use for. (str.format and
# format_map are handled in wrap_str_format, which Jinja consults first.)
_BLOCKED_STR_ATTRIBUTES = frozenset({"expandtabs", "translate", "maketrans"})

# printf-style conversion specs: "%(name)-10.5s", "%*d", ...
_PERCENT_SPEC_RE = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_PERCENT_REPR_RE = re.compile(r"%(?:\([^)]*\))?[#0\- +]*\d*(?:\.\d*)?[ra]")

# What the console shows, in Portuguese (the console's source language; the
# English catalog translates the msgid). str() of a TemplateError is the
# Portuguese sentence, which is also what a failed message keeps.
_HEAVY_STEPS = N_(
    "Modelo pesado demais: mais de %(max)s passos (repetições de laços, filtros e chamadas) "
    "em uma só mensagem",
    max=MAX_RENDER_STEPS,
)
_HEAVY_VOLUME = N_(
    "Modelo pesado demais: processa mais de %(max)s caracteres ao todo em uma só mensagem",
    max=MAX_RENDER_VOLUME,
)
_HEAVY_CPU = N_(
    "Modelo pesado demais: passou de %(segundos)s s de processamento",
    segundos=format(MAX_RENDER_CPU_SECONDS, "g"),
)
_HEAVY_VALUE = N_(
    "Modelo pesado demais: monta um valor com mais de %(max)s caracteres ou itens",
    max=MAX_VALUE_SIZE,
)
_HEAVY_NUMBER_ARGUMENT = N_(
    "Modelo pesado demais: usa um número maior que %(max)s como tamanho, largura ou contagem",
    max=_MAX_INT_ARGUMENT,
)
_HEAVY_TEXT_ARGUMENT = N_(
    "Modelo pesado demais: passa a um filtro um texto com mais de %(max)s caracteres",
    max=_MAX_TEXT_ARGUMENT,
)
_HEAVY_RANGE = N_("Modelo pesado demais: range() com mais de %(max)s números", max=_MAX_RANGE)
_HEAVY_NUMBER = N_("Modelo pesado demais: calcula um número grande demais")
_INTERNAL_VALUE = N_(
    "O modelo tenta mostrar um valor interno (função, método ou objeto do sistema), não um texto: "
    "confira se faltam parênteses, como em nome.upper()"
)


class TemplateError(Exception):
    """A message template cannot be compiled or rendered.

    The message says what is wrong (``"undefined variable 'nome_paciente'
    at line 2"``, ``"syntax error at line 2: ..."``, ``"Modelo pesado demais:
    ..."``) and never contains the value of any variable. ``lineno`` is the
    template line when known. ``text`` is set for the refusals of the
    render's bounds and of internal values: a translatable sentence
    (:class:`engine.words.texts.Text`) whose ``str()`` is the message; the console
    shows it in the reader's language. These refusals hold whatever the data
    (``whatever_the_data``), so a template that gets one on sample data is
    refused when saved. Every other error has a ``text`` too, saying what to fix.
    """

    def __init__(self, message: str, *, lineno: int | None = None, text: Text | None = None,
                 whatever_the_data: bool = False) -> None:
        super().__init__(message)
        self.lineno = lineno
        self.text = text
        #: The refusal would happen on any data (a bound of the render, an internal value), so a
        #: template that gets it on sample data is refused when saved.
        self.whatever_the_data = whatever_the_data


class _Refused(jinja2.sandbox.SecurityError):
    """A bound of the render was reached, or an internal value was printed."""

    def __init__(self, text: Text) -> None:
        super().__init__(str(text))
        self.text = text


class _OutsideRender(jinja2.sandbox.SecurityError):
    """A counting hook ran with no render budget.

    That happens only at compile time, when Jinja tries to fold constant
    expressions: raising makes it leave them to the render, where they are
    counted like everything else.
    """


# --- the budget of one render -------------------------------------------------------------------

_cpu_time = getattr(time, "thread_time", time.process_time)


class _Budget:
    __slots__ = ("deadline", "steps", "volume")

    def __init__(self) -> None:
        self.steps = MAX_RENDER_STEPS
        self.volume = MAX_RENDER_VOLUME
        # Reading the thread's CPU clock is a system call, slow on a busy VM: it is read at the
        # first check, not for every render (a reminder's render never reaches one). The steps
        # before that check (fewer than _DEADLINE_EVERY, each bounded) go uncounted.
        self.deadline: float | None = None

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise _Refused(_HEAVY_STEPS)
        if not self.steps % _DEADLINE_EVERY and self.out_of_time():
            raise _Refused(_HEAVY_CPU)

    def out_of_time(self) -> bool:
        """Whether the render has used its CPU time (starting the clock at the first check)."""
        now = _cpu_time()
        if self.deadline is None:
            self.deadline = now + MAX_RENDER_CPU_SECONDS
            return False
        return now > self.deadline


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("lembra_render_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:
        raise _OutsideRender("template code run outside a render")
    return budget


def _spend(steps: int = 1, volume: int = 0) -> None:
    """Charge one operation (or only the data it read or built) to the render's budget."""
    budget = _BUDGET.get()
    if budget is None:
        raise _OutsideRender("template code run outside a render")
    if steps:
        budget.steps -= steps
        if budget.steps < 0:
            raise _Refused(_HEAVY_STEPS)
        if not budget.steps % _DEADLINE_EVERY and budget.out_of_time():
            raise _Refused(_HEAVY_CPU)
    if volume:
        budget.volume -= volume
        if budget.volume < 0:
            raise _Refused(_HEAVY_VOLUME)


def _size(value: object) -> int:
    """len() of a value whose length is what an operation on it costs; 0 for the others."""
    if isinstance(value, (str, list, tuple, dict, bytes)):
        return len(value)
    return 0


def _checked(value: Any, volume: int = 0) -> Any:
    """A value an operation has just built: refused if too large; the operation is charged one step and
    `volume` (what it read) plus the size of what it built."""
    if isinstance(value, (str, list, tuple, dict, bytes)):
        size = len(value)
        if size > MAX_VALUE_SIZE:
            raise _Refused(_HEAVY_VALUE)
        volume += size
    elif isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        raise _Refused(_HEAVY_NUMBER)
    _spend(1, volume)
    return value


def _refuse_if_over(size: int) -> None:
    if size > MAX_VALUE_SIZE:
        raise _Refused(_HEAVY_VALUE)


def _text_shape(value: object) -> tuple[int, int, int]:
    """(upper bound of len(str(value)), containers' items visited, nesting depth).

    Only data has a text: strings, numbers, booleans, None and lists, tuples
    and dicts of them. Anything else (functions, methods, classes, generators,
    Jinja's loop/cycler/namespace objects) is refused, so that its repr is
    never shown; an undefined variable fails as undefined. The walk stops as
    soon as the bound passes :data:`MAX_VALUE_SIZE`, so that a list holding
    the same long string a thousand times costs two items, not a thousand.
    """
    if isinstance(value, str):  # str and Markup: str() is the value itself
        return len(value), 0, 0
    if isinstance(value, Undefined):
        if type(value) is Undefined:
            # The implicit else of {{ x if cond }}: Jinja renders it as "".
            return 0, 0, 0
        value._fail_with_undefined_error()
    total = visited = depth = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        visited += 1
        kind = type(item)
        if isinstance(item, str):
            # repr(): quotes, and escapes of up to 10 characters per character.
            n = len(item)
            total += (2 * n if item.isprintable() else 10 * n) + (2 if kind is str else 32)
        elif item is None or kind is bool or kind is float:
            total += 24
        elif kind is int:
            total += item.bit_length() * 31 // 100 + 2  # type: ignore[attr-defined]
        elif kind is list or kind is tuple or kind is dict:
            total += 2 + 4 * len(item)  # type: ignore[arg-type]
            _refuse_if_over(total)
            depth = max(depth, level + 1)
            children: Iterable[object] = (
                itertools.chain(item.keys(), item.values()) if kind is dict else item  # type: ignore[attr-defined]
            )
            stack.extend((child, level + 1) for child in children)
        elif isinstance(item, Undefined) and type(item) is not Undefined:
            item._fail_with_undefined_error()
        else:
            raise _Refused(_INTERNAL_VALUE)
        _refuse_if_over(total)
    _spend(0, visited * _PYTHON_WEIGHT)
    return total, visited, depth


def _text_size(value: object) -> int:
    """Upper bound of len(str(value)); see _text_shape."""
    kind = type(value)
    if kind is str:
        return len(value)  # type: ignore[arg-type]
    if kind is int:
        return value.bit_length() * 31 // 100 + 2  # type: ignore[attr-defined]
    if kind is float or kind is bool or value is None:
        return 24
    return _text_shape(value)[0]


# --- checks of single operations --------------------------------------------------------------


def _check_int_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    # Widths, counts and repeats are the only way a call can blow up from a
    # short template ("x"|center(10**9), items|batch(10**9), ...).
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > _MAX_INT_ARGUMENT:
            raise _Refused(_HEAVY_NUMBER_ARGUMENT)


def _check_text_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, str) and len(arg) > _MAX_TEXT_ARGUMENT:
            raise _Refused(_HEAVY_TEXT_ARGUMENT)


def _check_percent_format(fmt: object) -> None:
    if not isinstance(fmt, str):
        return
    for match in _PERCENT_SPEC_RE.finditer(fmt):
        for part in match.groups():
            if part == "*" or (part is not None and int(part) > _MAX_INT_ARGUMENT):
                raise _Refused(_HEAVY_NUMBER_ARGUMENT)


def _check_format(fmt: str, args: object) -> None:
    """`fmt % args` (the operator and the format filter): widths, and what the arguments add."""
    _check_percent_format(fmt)
    if isinstance(args, tuple):
        added = sum(_text_size(arg) for arg in args)
    elif isinstance(args, Mapping):
        # "%(a)s%(a)s…" uses one value many times; "%s" % {…} prints the whole dict.
        added = max(fmt.count("%") * max((_text_size(v) for v in args.values()), default=0),
                    _text_size(args))
    else:
        added = _text_size(args)
    if _PERCENT_REPR_RE.search(fmt):
        added *= 10
    _refuse_if_over(len(fmt) + added)


def _check_replace(text: str, args: tuple[Any, ...]) -> None:
    if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        # str.count("") is len + 1, so this also covers replacing "".
        _refuse_if_over(len(text) + text.count(args[0]) * len(args[1]))


def _join_items(value: Any) -> list[Any]:
    """The items a join will stringify, read at most one past the size cap."""
    items = list(itertools.islice(iter(value), MAX_VALUE_SIZE + 1))
    _refuse_if_over(len(items))
    return items


def _check_join(separator: object, items: list[Any]) -> None:
    size = _text_size(separator) * max(len(items) - 1, 0)
    for item in items:
        size += _text_size(item)
        _refuse_if_over(size)


def _check_indent(text: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    width = args[0] if args else kwargs.get("width", 4)
    per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    lines = text.count("\n") + 1 if isinstance(text, str) else 1
    _refuse_if_over(_text_size(text) + lines * per_line)


def _check_wordwrap(text: object, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    width = args[0] if args else kwargs.get("width", 79)
    wrap = args[2] if len(args) > 2 else kwargs.get("wrapstring")
    size = _text_size(text)
    if isinstance(wrap, str) and isinstance(width, int):
        # Greedy wrapping: two consecutive lines hold more than `width` characters.
        lines = 2 * size // max(width, 1) + (text.count("\n") if isinstance(text, str) else 0) + 2
        _refuse_if_over(size + lines * len(wrap))


def _safe_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > _MAX_RANGE:
        raise _Refused(_HEAVY_RANGE)
    return rng


def _counted(iterable: Iterable[Any], budget: _Budget) -> Iterator[Any]:
    for item in iterable:
        budget.step()
        yield item


# --- hooks the code generator inserts ------------------------------------------------------------

_LOOP = "lembra_loop"
_CONCAT = "lembra_concat"
_CHARGE = "lembra_charge"


def _loop_hook(iterable: Any) -> Iterator[Any]:
    """Around every ``for`` iterable: one step per item taken."""
    return _counted(iterable, _budget())


@pass_eval_context
def _concat_hook(eval_ctx: Any, parts: tuple[Any, ...]) -> str:
    """``a ~ b ~ …``: the size of the result is known, and refused, before it is built."""
    size = 0
    for part in parts:
        size += _text_size(part)
        _refuse_if_over(size)
    _spend(1, size)
    result = markup_join(parts) if eval_ctx.autoescape else str_join(parts)
    if len(result) > MAX_VALUE_SIZE:  # escaping can have made it longer
        raise _Refused(_HEAVY_VALUE)
    return result


def _charge_hook(value: Any) -> Any:
    """Around comparison operands and slices: ``x in big_list`` reads all of it."""
    _spend(1, _size(value))
    return value


def _finalize(value: Any) -> Any:
    """Every ``{{ … }}`` output: data only, its text's size charged (_spend, inlined: the hot path)."""
    size = len(value) if type(value) is str else _text_size(value)
    budget = _BUDGET.get()
    if budget is None:
        raise _OutsideRender("template code run outside a render")
    budget.step()
    budget.volume -= size
    if budget.volume < 0:
        raise _Refused(_HEAVY_VOLUME)
    return value


class _Instrument(NodeTransformer):
    """Put the counting hooks in the template's syntax tree before it is compiled."""

    def __init__(self, environment: jinja2.Environment) -> None:
        self.environment = environment

    def _wrap(self, node: nodes.Expr, hook: str) -> nodes.Filter:
        wrapped = nodes.Filter(node, hook, [], [], None, None, lineno=node.lineno)
        return wrapped.set_environment(self.environment)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._wrap(node.iter, _LOOP)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load", lineno=node.lineno).set_environment(self.environment)
        return self._wrap(parts, _CONCAT)

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        self.generic_visit(node)
        node.expr = self._wrap(node.expr, _CHARGE)
        for operand in node.ops:
            operand.expr = self._wrap(operand.expr, _CHARGE)
        return node

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.arg, nodes.Slice):  # slices do not go through the sandbox's getitem
            return self._wrap(node, _CHARGE)
        return node


class _CodeGenerator(CodeGenerator):
    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        _Instrument(self.environment).visit(node)
        super().visit_Template(node, frame)


# --- the filter and test tables -------------------------------------------------------------------

# Filters whose work does not grow with their input.
_CONSTANT_FILTERS = frozenset(
    {"abs", "attr", "count", "d", "default", "first", "float", "int", "last", "length", "random", "round"}
)
# Filters that take and give collections (lazy ones too) and never make text of them.
_COLLECTION_FILTERS = frozenset(
    {"batch", "dictsort", "groupby", "items", "list", "map", "max", "min", "reject", "rejectattr",
     "reverse", "select", "selectattr", "slice", "sort", "sum", "unique"}
)
# Text filters that work item by item in Python rather than in one C call.
_SLOW_TEXT_FILTERS = frozenset(
    {"pprint", "striptags", "title", "tojson", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr"}
)


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    # Filters are called directly by compiled templates, not through the
    # sandbox's call(), so they need their own guard. Filters decorated with
    # pass_context/pass_environment/pass_eval_context get that object first.
    # A filter not known as constant or as a collection one is treated as a
    # text filter: its input and arguments must be data, and are measured.
    at = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0

    if name in _CONSTANT_FILTERS:

        def constant(*args: Any, **kwargs: Any) -> Any:
            if len(args) > at + 1 or kwargs:
                _check_int_arguments(args[at + 1 :], kwargs)
            return _checked(func(*args, **kwargs))

        return functools.wraps(func)(constant)

    if name in _COLLECTION_FILTERS:

        def collection(*args: Any, **kwargs: Any) -> Any:
            extra = args[at + 1 :]
            _check_int_arguments(extra, kwargs)
            if name == "sum":
                start = extra[1] if len(extra) > 1 else kwargs.get("start", 0)
                if not isinstance(start, (int, float)):  # sum(start=[]) concatenates lists
                    raise jinja2.sandbox.SecurityError("sum is for numbers")
            _spend(0, _size(args[at]) * _PYTHON_WEIGHT if len(args) > at else 0)
            return _checked(func(*args, **kwargs))

        return functools.wraps(func)(collection)

    weight = _PYTHON_WEIGHT if name in _SLOW_TEXT_FILTERS else 1

    def text(*args: Any, **kwargs: Any) -> Any:
        value = args[at] if len(args) > at else None
        extra = args[at + 1 :]
        if extra or kwargs:
            _check_int_arguments(extra, kwargs)
        if name == "join":
            items = _join_items(value)
            _check_join(extra[0] if extra else kwargs.get("d", ""), items)
            args = (*args[:at], items, *extra)
            size = sum(map(_size, items))
        else:
            if name == "format":
                if not isinstance(value, str):
                    raise jinja2.sandbox.SecurityError("format needs a string")
                _check_format(value, kwargs or extra)
            elif name == "replace":
                if isinstance(value, str):
                    _check_replace(value, extra)
            elif name == "indent":
                _check_indent(value, extra, kwargs)
            elif name == "wordwrap":
                _check_wordwrap(value, extra, kwargs)
            elif extra or kwargs:
                if name == "tojson":
                    raise jinja2.sandbox.SecurityError("tojson takes no indent in templates")
                _check_text_arguments(extra, kwargs)
            if type(value) is str:
                size = len(value)
            else:
                size, visited, depth = _text_shape(value)
                if name == "pprint":  # one line per item, indented by its depth
                    _refuse_if_over(size + visited * (depth + 2))
            for arg in extra:
                size += _text_size(arg)
            for arg in kwargs.values():
                size += _text_size(arg)
        # Charged before the work: a text filter's cost is its input's size.
        _spend(0, size * weight)
        return _checked(func(*args, **kwargs))

    return functools.wraps(func)(text)


def _bounded_test(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # `x is in big_list`, `a is eq(b)`: reading their arguments is the work.
        _spend(1, sum(map(_size, args)))
        return func(*args, **kwargs)

    return wrapper


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Sandbox with size and work limits; immutable so templates cannot alter inputs."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, *, autoescape: bool) -> None:
        super().__init__(
            undefined=jinja2.StrictUndefined,
            autoescape=autoescape,
            # Staff put {% if %} blocks on their own lines; without these a
            # WhatsApp message would be full of blank lines.
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=_finalize,
        )
        self.globals.pop("lipsum", None)
        self.globals["range"] = _safe_range
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters.update({_LOOP: _loop_hook, _CONCAT: _concat_hook, _CHARGE: _charge_hook})
        self.tests = {name: _bounded_test(f) for name, f in self.tests.items()}

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """Join the output of a macro, a block or a {% set %} block: measured first."""
        if not isinstance(parts, list):
            parts = list(parts)
        size = sum(map(len, parts))
        _refuse_if_over(size)
        _spend(1, size)
        return "".join(parts)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str) and attr in _BLOCKED_STR_ATTRIBUTES:
            return False
        return super().is_safe_attribute(obj, attr, value)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # "{:>1000000000}".format(x) builds its result inside one C call that
        # no size check can interrupt, and templates already have {{ }}.
        if super().wrap_str_format(value) is None:
            return None

        def forbidden(*args: Any, **kwargs: Any) -> str:
            raise jinja2.sandbox.SecurityError("str.format is not available in templates")

        return forbidden

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                _refuse_if_over(len(left) + len(right))
        elif operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                    _refuse_if_over(len(seq) * count)
            both_ints = isinstance(left, int) and isinstance(right, int)
            if both_ints and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise _Refused(_HEAVY_NUMBER)
        elif operator == "**":
            both_ints = isinstance(left, int) and isinstance(right, int) and right > 0
            if both_ints and max(abs(left).bit_length(), 1) * right > _MAX_INT_BITS:
                raise _Refused(_HEAVY_NUMBER)
        elif operator == "%" and isinstance(left, str):
            _check_format(left, right)
        return _checked(super().call_binop(context, operator, left, right), _size(left) + _size(right))

    def call(  # noqa: N805 - Jinja's own signature, avoids kwarg clashes
        __self, __context: Context, __obj: Any, *args: Any, **kwargs: Any
    ) -> Any:
        _check_int_arguments(args, kwargs)
        volume = sum(map(_size, args)) + sum(map(_size, kwargs.values()))
        receiver = getattr(__obj, "__self__", None)
        if isinstance(receiver, str):
            volume += len(receiver)
            method = getattr(__obj, "__name__", None)
            if method == "replace":
                _check_replace(receiver, args)
            elif method == "join" and len(args) == 1 and not kwargs:
                items = _join_items(args[0])
                _check_join(receiver, items)
                args = (items,)
        elif isinstance(__obj, LoopContext) and args:
            # loop(children) in a recursive for: its items are counted like the first level's.
            args = (_counted(args[0], _budget()), *args[1:])
        _spend(0, volume)
        return _checked(super().call(__context, __obj, *args, **kwargs))


_TEXT_ENV = _Sandbox(autoescape=False)
_HTML_ENV = _Sandbox(autoescape=True)


def _template_lineno(tb: TracebackType | None) -> int | None:
    # Jinja rewrites tracebacks so that template frames carry template line
    # numbers; the innermost one is where the error happened.
    lineno = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEMPLATE_FILENAME:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return lineno


def _at(lineno: int | None) -> str:
    return f" at line {lineno}" if lineno is not None else ""


_UNDEFINED_NAME_RE = re.compile(r"^'([^']*)' is undefined$")
_UNDEFINED_ATTR_RE = re.compile(r"has no attribute '([^']*)'$")


def _undefined_message(exc: jinja2.UndefinedError, source: str) -> str:
    text = str(exc)
    # A name is only echoed if it literally appears in the template source:
    # then it came from the author, not from data (the attr filter or a
    # subscript can look things up by a variable's value).
    match = _UNDEFINED_NAME_RE.match(text)
    if match:
        name = match.group(1)
        return f"undefined variable '{name}'" if name in source else "undefined variable"
    match = _UNDEFINED_ATTR_RE.search(text)
    if match:
        name = match.group(1)
        return f"undefined attribute '{name}'" if name in source else "undefined attribute"
    return "undefined item"


def _refusal(text: Text, lineno: int | None) -> TemplateError:
    if lineno is not None:
        text = N_("%(erro)s (linha %(linha)s)", erro=text, linha=lineno)
    return TemplateError(str(text), lineno=lineno, text=text, whatever_the_data=True)


def _explained(message: str, text: Text, lineno: int | None) -> TemplateError:
    """An error with its English note for logs and tests, and its sentence for the person who
    wrote the template (Jinja's own wording is English and speaks of tokens)."""
    if lineno is not None:
        text = N_("%(erro)s (linha %(linha)s)", erro=text, linha=lineno)
    return TemplateError(message, lineno=lineno, text=text)


_NO_FILTER_RE = re.compile(r"No filter named '([^']*)'")
_UNKNOWN_TAG_RE = re.compile(r"Encountered unknown tag '([^']*)'")


def _syntax_text(exc: jinja2.TemplateSyntaxError) -> Text:
    """Jinja's syntax errors said as what to fix (the names quoted come from the template)."""
    message = exc.message or ""
    lowered = message.lower()
    if "unexpected end of template" in lowered:
        if "endif" in message:
            return N_("Falta o {% endif %} que fecha um {% if %}.")
        if "endfor" in message:
            return N_("Falta o {% endfor %} que fecha um {% for %}.")
        return N_("O modelo acaba antes de fechar um {{ }} ou um bloco {% %}. Feche-o.")
    match = _NO_FILTER_RE.search(message)
    if match:
        return N_("O filtro %(filtro)s não existe. Use upper, lower, title ou capitalize, ou remova-o.",
                  filtro=match.group(1))
    match = _UNKNOWN_TAG_RE.search(message)
    if match:
        return N_("O bloco {%% %(bloco)s %%} não existe ou está fora do lugar. Use if, elif, else, endif, for ou "
                  "endfor.", bloco=match.group(1))
    return N_("Escrita do modelo com erro: confira se cada {{ tem o seu }} e cada {% if %} o seu {% endif %}.")


def _undefined_text(exc: jinja2.UndefinedError, source: str) -> Text:
    match = _UNDEFINED_NAME_RE.match(str(exc))
    names = ", ".join("{{ %s }}" % name for name in sorted(SAMPLE_VARIABLES))
    if match and match.group(1) in source:
        return N_("A variável %(nome)s não existe. Use uma destas: %(variaveis)s.", nome=match.group(1),
                  variaveis=names)
    return N_("O modelo usa uma variável ou um campo que não existe. Use uma destas: %(variaveis)s.",
              variaveis=names)


def _translate(exc: Exception, source: str) -> TemplateError:
    """Map any compile/render failure to a TemplateError with no data in it."""
    if isinstance(exc, TemplateError):
        return exc
    if isinstance(exc, jinja2.TemplateSyntaxError):
        # The message describes the template text (written by staff), never
        # variable values, so it is safe and useful to show.
        return _explained(f"syntax error at line {exc.lineno}: {exc.message}", _syntax_text(exc), exc.lineno)
    lineno = _template_lineno(exc.__traceback__)
    if isinstance(exc, _Refused):
        return _refusal(exc.text, lineno)
    if isinstance(exc, jinja2.sandbox.SecurityError):
        # SecurityError messages can include reprs of the objects involved.
        return _explained(f"forbidden operation in template{_at(lineno)}",
                          N_("O modelo tenta uma operação que não é permitida. Use só variáveis, filtros e "
                             "blocos if e for."), lineno)
    if isinstance(exc, jinja2.UndefinedError):
        return _explained(f"{_undefined_message(exc, source)}{_at(lineno)}", _undefined_text(exc, source), lineno)
    if isinstance(exc, MemoryError):
        return _refusal(_HEAVY_VALUE, lineno)
    # Anything else (TypeError, ZeroDivisionError, ...) may quote values in
    # its message, so only the exception type is reported.
    return _explained(f"error rendering template{_at(lineno)}: {type(exc).__name__}",
                      N_("O modelo falhou ao montar a mensagem (uma conta ou um filtro com um valor que não "
                         "serve). Simplifique essa parte."), lineno)


def _check_source(source: str) -> None:
    if not isinstance(source, str):
        raise TemplateError("template must be a string")
    if len(source) > MAX_SOURCE_LENGTH:
        raise TemplateError(f"template too long (max {MAX_SOURCE_LENGTH} characters)",
                            text=N_("O modelo é longo demais (máximo de %(max)s caracteres). Encurte o texto.",
                                    max=MAX_SOURCE_LENGTH))


@functools.lru_cache(maxsize=512)
def _compile_text(source: str) -> jinja2.Template:
    return _flat_globals(_TEXT_ENV.from_string(source))


@functools.lru_cache(maxsize=512)
def _compile_html(source: str) -> jinja2.Template:
    return _flat_globals(_HTML_ENV.from_string(source))


def _flat_globals(template: jinja2.Template) -> jinja2.Template:
    """The template with its globals in a plain dict: Jinja keeps them in a ChainMap over the
    environment's, which every render copies key by key (a third of a short render's own time).
    The environments' globals are set once, when they are built, so nothing is missed."""
    template.globals = dict(template.globals)
    return template


def _compile(source: str, compiler: Callable[[str], jinja2.Template]) -> jinja2.Template:
    _check_source(source)
    try:
        return compiler(source)
    except Exception as exc:  # noqa: BLE001 - every failure becomes TemplateError
        raise _translate(exc, source) from None


def _render(
    source: str,
    variables: Mapping[str, object],
    compiler: Callable[[str], jinja2.Template],
    limit: int,
) -> str:
    template = _compile(source, compiler)
    chunks: list[str] = []
    size = 0
    token = _BUDGET.set(_Budget())
    try:
        stream: Iterator[str] = template.generate(dict(variables))
        try:
            # Streaming lets a runaway loop be stopped as soon as it crosses the
            # limit instead of after it has produced everything.
            for chunk in stream:
                size += len(chunk)
                if size > limit:
                    raise TemplateError("rendered message too long")
                chunks.append(chunk)
        except Exception as exc:  # noqa: BLE001 - every failure becomes TemplateError
            raise _translate(exc, source) from None
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    finally:
        _BUDGET.reset(token)
    return "".join(chunks)


def render_text(source: str, variables: Mapping[str, object]) -> str:
    """Render a plain-text (WhatsApp/SMS) template; no escaping is applied.

    :raises TemplateError: on syntax errors, undefined variables, sandbox
        violations, sources over :data:`MAX_SOURCE_LENGTH` characters,
        output over :data:`MAX_TEXT_OUTPUT` characters (``"rendered message
        too long"``), a render past its bounds (``"Modelo pesado demais:
        …"``, see the module docstring) or the printing of an internal value.
    """
    return _render(source, variables, _compile_text, MAX_TEXT_OUTPUT)


def render_html(source: str, variables: Mapping[str, object]) -> str:
    """Render an HTML (e-mail) template with autoescaping of variables.

    :raises TemplateError: as :func:`render_text`, with an output limit of
        :data:`MAX_HTML_OUTPUT` characters.
    """
    return str(_render(source, variables, _compile_html, MAX_HTML_OUTPUT))


def validate(source: str) -> None:
    """Check that a template compiles (for admin form validation).

    Only syntax is checked (unknown filters and tags included); variables are
    not, since they are only known at render time.

    :raises TemplateError: with the line and description of the problem.
    """
    _compile(source, _compile_text)


_MODE_LABELS: Mapping[str, Mapping[str, str]] = {
    "pt": {"online": "Online", "in_person": "Presencial"},
    "en": {"online": "Online", "in_person": "In person"},
    "es": {"online": "En línea", "in_person": "Presencial"},
}


def _plain_spaces(text: str) -> str:
    # CLDR puts NO-BREAK / NARROW NO-BREAK spaces in times ("2:00\u202fPM");
    # any non-GSM character forces an SMS into UCS-2 and halves its length.
    return text.replace("\u202f", " ").replace("\u00a0", " ")


def reminder_variables(
    *,
    contact_name: str | None,
    professional: str | None,
    starts_at: datetime,
    timezone: str,
    mode: str | None,
    location: str | None,
    org_name: str,
    locale: str = "pt_BR",
) -> dict[str, object]:
    """Build the variables available to reminder templates.

    Dates and times are expressed in ``timezone`` (the clinic's), never UTC,
    and formatted for ``locale``:

    - ``nome``: contact's first name (``""`` if unknown); ``nome_completo``
    - ``profissional``, ``local``, ``clinica``
    - ``data`` (``"21/03"``), ``data_completa`` (``"sábado, 21 de março de
      2026"``), ``dia_semana`` (``"sábado"``), ``hora`` (``"14:00"``)
    - ``modalidade``: ``"online"`` → ``"Online"``, ``"in_person"`` →
      ``"Presencial"`` (localised), any other value as is.

    :raises ValueError: if ``starts_at`` is naive, or the timezone or locale
        is unknown.
    """
    if starts_at.tzinfo is None or starts_at.utcoffset() is None:
        raise ValueError("starts_at must be timezone-aware")
    try:
        ZoneInfo(timezone)  # refuse an unknown zone before formatting in it
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"unknown timezone {timezone!r}") from None
    babel_locale = _babel_locale(locale)

    full_name = " ".join((contact_name or "").split())
    labels = _MODE_LABELS.get(babel_locale.language, _MODE_LABELS["pt"])
    mode_label = labels.get(mode, mode) if mode else ""

    return {
        "nome": full_name.split(" ", 1)[0] if full_name else "",
        "nome_completo": full_name,
        "profissional": (professional or "").strip(),
        # To the minute: no variable shows seconds, and a clinic's appointments of a day then
        # share a few dozen cache entries however their instants were typed.
        **_when(starts_at.astimezone(UTC).replace(second=0, microsecond=0), timezone, str(babel_locale)),
        "modalidade": mode_label,
        "local": (location or "").strip(),
        "clinica": org_name,
    }


@functools.lru_cache(maxsize=64)
def _babel_locale(locale: str) -> Locale:
    """Babel's Locale for a locale name ("pt_BR" or "pt-BR"); parsing one costs more than a
    reminder's other variables together, and an install uses a handful."""
    try:
        return Locale.parse(locale.replace("-", "_"))
    except (UnknownLocaleError, ValueError, TypeError, AttributeError):
        raise ValueError(f"unknown locale {locale!r}") from None


@functools.lru_cache(maxsize=64)
def _day_month_pattern(locale: str) -> DateTimePattern:
    """The locale's day/month pattern (`format_skeleton("ddMM")`'s): matching the skeleton costs
    ~200 µs, more than all the rest of a reminder's date formatting, so it is matched once."""
    skeletons = Locale.parse(locale).datetime_skeletons
    return skeletons[match_skeleton("ddMM", skeletons)]


@functools.lru_cache(maxsize=4096)
def _when(starts_at: datetime, timezone: str, locale: str) -> dict[str, str]:
    """The date and time variables of one instant, zone and locale. Cached: Babel's formatting
    is a third of a send's rendering, and a morning's reminders share a few dozen time slots."""
    tz = ZoneInfo(timezone)
    babel_locale = Locale.parse(locale)
    local = starts_at.astimezone(tz)
    return {
        "data": _plain_spaces(format_datetime(local, _day_month_pattern(locale), tzinfo=tz, locale=babel_locale)),
        "data_completa": _plain_spaces(format_date(local.date(), format="full", locale=babel_locale)),
        "hora": _plain_spaces(format_time(local, format="short", tzinfo=tz, locale=babel_locale)),
        "dia_semana": format_date(local.date(), format="EEEE", locale=babel_locale),
    }


# Fictitious data for template previews in the admin; never a real patient.
SAMPLE_VARIABLES: dict[str, object] = reminder_variables(
    contact_name="Ana Clara Souza",
    professional="Dra. Beatriz Costa",
    starts_at=datetime(2026, 3, 21, 17, 0, tzinfo=UTC),
    timezone="America/Sao_Paulo",
    mode="in_person",
    location="Rua das Flores, 123 - Centro",
    org_name="Clínica Exemplo",
)
