"""Render clinic-authored message templates (Jinja2 syntax) safely.

Templates are written by clinic staff in the admin and are therefore
untrusted: they are rendered in a sandbox with strict undefined variables,
size limits on the source, on intermediate values and on the output.

:class:`TemplateError` messages name the problem (undefined variable, syntax
error, line number) but never a variable's value: the values are patient
data and error messages end up in logs and admin screens.

The sandbox bounds output size and the obvious "make a huge string" tricks,
but it cannot bound CPU time of deeply nested loops; rendering should still
run under the worker's time limit.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jinja2
import jinja2.sandbox
from babel import Locale, UnknownLocaleError
from babel.dates import format_date, format_skeleton, format_time
from jinja2.runtime import Context

__all__ = [
    "MAX_HTML_OUTPUT",
    "MAX_SOURCE_LENGTH",
    "MAX_TEXT_OUTPUT",
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

# Bounds on values built *inside* a render, so that a one-liner such as
# {{ 'x' * 10**9 }} fails fast instead of allocating gigabytes before the
# output cap gets a chance to look at it.
_MAX_INTERMEDIATE = MAX_HTML_OUTPUT
_MAX_INT_ARGUMENT = 10_000
_MAX_RANGE = 1_000
_MAX_POWER_BITS = 4_096

# Jinja gives templates built from strings this pseudo file name; it is how
# the template line is found in a runtime traceback.
_TEMPLATE_FILENAME = "<template>"

# str methods that can expand a short string into a huge one from a tiny
# argument, and which message templates have no use for. (str.format and
# format_map are handled in wrap_str_format, which Jinja consults first.)
_BLOCKED_STR_ATTRIBUTES = frozenset({"expandtabs"})

# printf-style conversion specs: "%(name)-10.5s", "%*d", ...
_PERCENT_SPEC_RE = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


class TemplateError(Exception):
    """A message template cannot be compiled or rendered.

    The message says what is wrong (``"undefined variable 'nome_paciente'
    at line 2"``, ``"syntax error at line 2: ..."``) and never contains the
    value of any variable. ``lineno`` is the template line when known.
    """

    def __init__(self, message: str, *, lineno: int | None = None) -> None:
        super().__init__(message)
        self.lineno = lineno


class _TooLarge(jinja2.sandbox.SecurityError):
    """An operation inside the template would build an oversized value."""


def _check_size(value: object) -> object:
    if isinstance(value, (str, bytes, list, tuple)) and len(value) > _MAX_INTERMEDIATE:
        raise _TooLarge("value too large")
    return value


def _check_int_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    # Widths, counts and repeats are the only way a call can blow up from a
    # short template ("x"|center(10**9), items|batch(10**9), ...).
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > _MAX_INT_ARGUMENT:
            raise _TooLarge("numeric argument too large")


def _check_percent_format(fmt: object) -> None:
    if not isinstance(fmt, str):
        return
    for match in _PERCENT_SPEC_RE.finditer(fmt):
        for part in match.groups():
            if part == "*" or (part is not None and int(part) > _MAX_INT_ARGUMENT):
                raise _TooLarge("format width too large")


def _check_replace(text: str, args: tuple[Any, ...]) -> None:
    if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        # str.count("") is len + 1, so this also covers replacing "".
        if len(text) + text.count(args[0]) * len(args[1]) > _MAX_INTERMEDIATE:
            raise _TooLarge("replacement result too large")


def _safe_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > _MAX_RANGE:
        raise _TooLarge("range too large")
    return rng


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    # Filters are called directly by compiled templates, not through the
    # sandbox's call(), so they need their own guard. Filters decorated with
    # pass_context/pass_environment/pass_eval_context get that object first.
    value_index = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        value = args[value_index] if len(args) > value_index else None
        _check_int_arguments(args[value_index + 1 :], kwargs)
        if name == "format":
            _check_percent_format(value)
        elif name == "replace" and isinstance(value, str):
            _check_replace(value, args[value_index + 1 :])
        return _check_size(func(*args, **kwargs))

    return wrapper


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Sandbox with size limits; immutable so templates cannot alter inputs."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, *, autoescape: bool) -> None:
        super().__init__(
            undefined=jinja2.StrictUndefined,
            autoescape=autoescape,
            # Staff put {% if %} blocks on their own lines; without these a
            # WhatsApp message would be full of blank lines.
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.globals.pop("lipsum", None)
        self.globals["range"] = _safe_range
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

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
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                    if len(seq) * count > _MAX_INTERMEDIATE:
                        raise _TooLarge("repetition too large")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0:
                if max(abs(left).bit_length(), 1) * right > _MAX_POWER_BITS:
                    raise _TooLarge("power too large")
        elif operator == "%":
            _check_percent_format(left)
        return _check_size(super().call_binop(context, operator, left, right))

    def call(  # noqa: N805 - Jinja's own signature, avoids kwarg clashes
        __self, __context: Context, __obj: Any, *args: Any, **kwargs: Any
    ) -> Any:
        _check_int_arguments(args, kwargs)
        if getattr(__obj, "__name__", None) == "replace" and isinstance(
            getattr(__obj, "__self__", None), str
        ):
            _check_replace(__obj.__self__, args)
        return _check_size(super().call(__context, __obj, *args, **kwargs))


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


def _translate(exc: Exception, source: str) -> TemplateError:
    """Map any compile/render failure to a TemplateError with no data in it."""
    if isinstance(exc, TemplateError):
        return exc
    if isinstance(exc, jinja2.TemplateSyntaxError):
        # The message describes the template text (written by staff), never
        # variable values, so it is safe and useful to show.
        return TemplateError(f"syntax error at line {exc.lineno}: {exc.message}", lineno=exc.lineno)
    lineno = _template_lineno(exc.__traceback__)
    if isinstance(exc, _TooLarge):
        return TemplateError(
            f"template builds a value that is too large{_at(lineno)}", lineno=lineno
        )
    if isinstance(exc, jinja2.sandbox.SecurityError):
        # SecurityError messages can include reprs of the objects involved.
        return TemplateError(f"forbidden operation in template{_at(lineno)}", lineno=lineno)
    if isinstance(exc, jinja2.UndefinedError):
        return TemplateError(f"{_undefined_message(exc, source)}{_at(lineno)}", lineno=lineno)
    # Anything else (TypeError, ZeroDivisionError, ...) may quote values in
    # its message, so only the exception type is reported.
    return TemplateError(
        f"error rendering template{_at(lineno)}: {type(exc).__name__}", lineno=lineno
    )


def _check_source(source: str) -> None:
    if not isinstance(source, str):
        raise TemplateError("template must be a string")
    if len(source) > MAX_SOURCE_LENGTH:
        raise TemplateError(f"template too long (max {MAX_SOURCE_LENGTH} characters)")


@functools.lru_cache(maxsize=512)
def _compile_text(source: str) -> jinja2.Template:
    return _TEXT_ENV.from_string(source)


@functools.lru_cache(maxsize=512)
def _compile_html(source: str) -> jinja2.Template:
    return _HTML_ENV.from_string(source)


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
    return "".join(chunks)


def render_text(source: str, variables: Mapping[str, object]) -> str:
    """Render a plain-text (WhatsApp/SMS) template; no escaping is applied.

    :raises TemplateError: on syntax errors, undefined variables, sandbox
        violations, sources over :data:`MAX_SOURCE_LENGTH` characters or
        output over :data:`MAX_TEXT_OUTPUT` characters
        (``"rendered message too long"``).
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
        tz = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"unknown timezone {timezone!r}") from None
    try:
        babel_locale = Locale.parse(locale.replace("-", "_"))
    except (UnknownLocaleError, ValueError, TypeError):
        raise ValueError(f"unknown locale {locale!r}") from None

    local = starts_at.astimezone(tz)
    full_name = " ".join((contact_name or "").split())
    labels = _MODE_LABELS.get(babel_locale.language, _MODE_LABELS["pt"])
    mode_label = labels.get(mode, mode) if mode else ""

    return {
        "nome": full_name.split(" ", 1)[0] if full_name else "",
        "nome_completo": full_name,
        "profissional": (professional or "").strip(),
        "data": _plain_spaces(format_skeleton("ddMM", local, tzinfo=tz, locale=babel_locale)),
        "data_completa": _plain_spaces(
            format_date(local.date(), format="full", locale=babel_locale)
        ),
        "hora": _plain_spaces(format_time(local, format="short", tzinfo=tz, locale=babel_locale)),
        "dia_semana": format_date(local.date(), format="EEEE", locale=babel_locale),
        "modalidade": mode_label,
        "local": (location or "").strip(),
        "clinica": org_name,
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
