"""JSON documents as Lembra accepts them from outside (a request body, a flow graph a caller hands
the engine): readable as JSON, nested no deeper than MAX_DEPTH, and storable as they are in either
database — every number finite and within a 64-bit integer's range, no string or key with a NUL
character or a lone surrogate (PostgreSQL's jsonb and text refuse both, and UTF-8 cannot encode a
surrogate, so one such character would fail the write instead of the check).

`loads` parses bytes strictly and `find_problem` walks a document that is already parsed; both
say where the first problem is, as a path and a `detail_*` catalogue code, so a person reads what
to fix. Neither recurses, so a hostile document cannot exhaust the interpreter's stack here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.words.catalogue import describe
from engine.words.texts import Text

#: How deep containers may nest (the document itself is level 1). A flow graph needs about seven.
MAX_DEPTH = 32
#: The integers a document may hold: PostgreSQL's bigint, SQLite's INTEGER, any 64-bit reader.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: The longest key a path shows whole (a path is read by a person, and echoed in refusals).
PATH_PART_CHARS = 40

# A surrogate in a decoded str is always a lone one: json decodes a valid pair into one character.
_SURROGATE = re.compile("[\ud800-\udfff]")
_INT_DIGITS = len(str(INT_MAX))


@dataclass(frozen=True)
class JsonProblem:
    """The first value of a document that is refused: where (`path`), and why (a `detail_*` code
    of the catalogue with its `params`)."""

    path: tuple[str | int, ...]
    code: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def detail(self) -> Text:
        """What the value should be, as a short phrase (pt-BR msgid)."""
        return describe(self.code, **self.params)

    def field(self, root: str = "$") -> str:
        """The dotted path (`draft_graph.nodes.0.config`), each key cut to PATH_PART_CHARS; `root`
        for the document itself."""
        return ".".join(_short(str(part)) for part in self.path) or root


class JsonRefused(ValueError):
    """A document refused by `loads`: `code` is a catalogue code with `params`; `problem` says
    which value when the document was read but a value in it is refused (None when it could not
    be read at all: not JSON, or nested too deep)."""

    def __init__(self, code: str, params: Mapping[str, Any] | None = None,
                 problem: JsonProblem | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.params = dict(params or {})
        self.problem = problem

    @property
    def message(self) -> Text:
        """The sentence a person reads (pt-BR msgid)."""
        return describe(self.code, **self.params)


class _Unreadable:
    """A number the parser met that no column holds (NaN, Infinity, 1e999, 2**64): kept in place
    of the value so that the walk reports where it is."""

    __slots__ = ("code", "params")

    def __init__(self, code: str, **params: Any) -> None:
        self.code, self.params = code, params


def storable_text(value: str) -> bool:
    """Whether both databases can store `value`: no NUL character and no lone surrogate."""
    return "\x00" not in value and _SURROGATE.search(value) is None


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """`raw` (UTF-8 bytes, or text) as a JSON document; JsonRefused when it is not JSON
    (`body_not_json`), nests deeper than `max_depth` (`body_too_deep`), or holds a value no
    database stores (`body_invalid_value`, with the path in `field` and what to fix in `detail`)."""
    try:
        document = json.loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:  # e.g. a megabyte of "[": the parser gives up long before the walk would
        raise JsonRefused("body_too_deep", {"max": max_depth}) from None
    except (ValueError, UnicodeDecodeError, TypeError):
        raise JsonRefused("body_not_json") from None
    problem = find_problem(document, max_depth=max_depth)
    if problem is None:
        return document
    if problem.code == "detail_too_deep":
        raise JsonRefused("body_too_deep", {"max": max_depth})
    raise JsonRefused("body_invalid_value", {"field": problem.field(), "detail": problem.detail}, problem)


def find_problem(document: Any, *, max_depth: int = MAX_DEPTH) -> JsonProblem | None:
    """The first value of `document` (in document order) that is not storable JSON, or None:
    a container nested deeper than `max_depth`, a non-finite float, an integer beyond 64 bits, a
    string or key with NUL or a lone surrogate, or a value JSON has no type for."""
    pending: list[tuple[Any, tuple[str | int, ...], int]] = [(document, (), 1)]
    while pending:
        value, path, depth = pending.pop()
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str):
            if not storable_text(value):
                return JsonProblem(path, "detail_unstorable")
        elif isinstance(value, int):
            if not INT_MIN <= value <= INT_MAX:
                return JsonProblem(path, "detail_number_range")
        elif isinstance(value, float):
            if not math.isfinite(value):
                return JsonProblem(path, "detail_not_finite")
        elif isinstance(value, _Unreadable):
            return JsonProblem(path, value.code, value.params)
        elif isinstance(value, (Mapping, list, tuple)):
            if depth > max_depth:
                return JsonProblem(path, "detail_too_deep", {"max": max_depth})
            if isinstance(value, Mapping):
                for key in value:
                    if isinstance(key, str) and not storable_text(key):
                        return JsonProblem(path, "detail_unstorable")
                children = [(item, (*path, key), depth + 1) for key, item in value.items()]
            else:
                children = [(item, (*path, index), depth + 1) for index, item in enumerate(value)]
            pending.extend(reversed(children))  # the first child is looked at first
        else:
            return JsonProblem(path, "detail_invalid")
    return None


def _constant(name: str) -> _Unreadable:
    return _Unreadable("detail_not_finite")  # NaN, Infinity, -Infinity: Python reads them, JSON has none


def _float(text: str) -> float | _Unreadable:
    value = float(text)
    return value if math.isfinite(value) else _Unreadable("detail_number_range")  # 1e999


def _int(text: str) -> int | _Unreadable:
    # The length first: Python refuses to convert more than 4300 digits (a ValueError: "not JSON").
    if len(text.lstrip("-")) > _INT_DIGITS or not INT_MIN <= (value := int(text)) <= INT_MAX:
        return _Unreadable("detail_number_range")
    return value


def _short(part: str) -> str:
    return part if len(part) <= PATH_PART_CHARS else part[:PATH_PART_CHARS - 1] + "…"
