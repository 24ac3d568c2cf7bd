"""Parsing the project's own Python for the tests that read its source."""

from __future__ import annotations

import ast

#: Tries of one parse (see `parse`).
_TRIES = 3


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, tried again when CPython 3.11 trips on its own bookkeeping. The recursion
    counter it keeps while it builds the tree's objects is the interpreter's, not the thread's,
    and 3.11 parses a source line again to place the carets of every traceback it prints: a thread
    a test left running (a loopback fake logging a client that hung up) printing one meanwhile
    makes the parse fail with "AST constructor recursion depth mismatch". The source is fine; the
    next parse, alone, succeeds."""
    for attempt in range(_TRIES):
        try:
            return ast.parse(source, filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")
