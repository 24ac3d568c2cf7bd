"""The AI interface of follow-up flows and the values that cross it.

Three jobs, one interface (`AI`): classify a patient's reply into one of a node's declared
classes, write a follow-up message, and plan the timing of a flow's smart waits. Every answer
says how many LLM calls it cost (`llm_calls`, for the enrollment's counters) and why it came out
as it did (`reason`, a code of `REASON_CODES` that the catalogue turns into a sentence). Failures
that the flow engine should retry or give up on are `AIError`s; anything the model got wrong is
not an error but an answer with a `None` and a reason (the flow then takes its fallback).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Literal, Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from engine.words.understanding import Context, Understanding

__all__ = [
    "AI",
    "ERROR_CODES",
    "REASON_CODES",
    "AIContext",
    "AIError",
    "Classification",
    "Plan",
    "PlannedWait",
    "SmartWait",
    "Turn",
    "Written",
    "clamp",
]

#: Every `reason` an answer can carry (the catalogue is checked against this tuple).
REASON_CODES: tuple[str, ...] = (
    "builtin_keywords",  # classify: a keyword of a declared class matched
    "builtin_template",  # write: the built-in never writes; the runtime sends the template
    "builtin_max",  # plan: the built-in waits each smart wait's maximum
    "no_match",  # classify: no declared class recognised (the flow takes its fallback edge)
    "no_waits",  # plan: nothing to plan, no call made
    "ai_ok",  # the model answered within the schema
    "ai_partial",  # plan: a valid answer that left some waits out or had unusable entries
    "ai_malformed",  # the model's answer was not JSON, or not the schema's shape
    "too_long",  # write: the message is longer than the node's max_chars
)

#: Every `AIError.code`. Transient: timeout, connection_error, rate_limited, server_error,
#: answer_too_large. Permanent: the `http_<status>` codes, http_error (any other 4xx),
#: llm_key_unreadable, llm_url_invalid and egress_refused.
ERROR_CODES: tuple[str, ...] = (
    "timeout",  # no whole answer within the call's deadline (connect included)
    "connection_error",
    "rate_limited",
    "server_error",
    "answer_too_large",  # the answer passed the size cap (or came compressed, unasked)
    "http_400",
    "http_401",
    "http_403",
    "http_404",
    "http_409",
    "http_413",
    "http_422",
    "http_error",
    "llm_key_unreadable",
    "llm_url_invalid",  # the agent's base URL is not one the HTTP client can use (saved before it was checked)
    "egress_refused",  # permanent: the agent's LLM URL resolves to an address ops did not allow
)


class AIError(Exception):
    """A call that did not produce an answer.

    `permanent` tells the flow engine whether retrying can help: a timeout, a connection error,
    a 429 or a 5xx are transient (the node is deferred and backed off); a rejected key, an unknown
    model or a request the server refuses are permanent. The message is safe to log: it never
    holds the patient's text, the prompt, the server's response body or the API key.
    """

    def __init__(self, message: str, *, permanent: bool, code: str) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.code = code

    def __repr__(self) -> str:
        return f"AIError({str(self)!r}, permanent={self.permanent}, code={self.code!r})"


def _require_aware(value: datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware")


@dataclass(frozen=True)
class Turn:
    """One message of the recent conversation."""

    role: Literal["patient", "clinic"]
    text: str
    at: datetime

    def __post_init__(self) -> None:
        if self.role not in ("patient", "clinic"):
            raise ValueError(f"unknown turn role {self.role!r}")
        _require_aware(self.at, "Turn.at")


def _freeze_keywords(keywords: Mapping[str, Sequence[str]]) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({str(name): tuple(words) for name, words in keywords.items()})


@dataclass(frozen=True)
class AIContext:
    """What every job may know about the org, the contact and the conversation.

    `now` is the instant of the decision (aware); `timezone` the org's IANA zone, used to tell
    the model the local time; `history` the recent conversation, oldest first; `org_keywords`
    the org's own keyword lists for well-known classes (`{"confirm": ("ok", …), …}`).
    """

    org_name: str
    persona: str | None
    contact_first_name: str | None
    locale: str
    timezone: str
    now: datetime
    history: tuple[Turn, ...] = ()
    org_keywords: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require_aware(self.now, "AIContext.now")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {self.timezone!r}") from None
        # Callers pass lists and dicts; store immutable copies so a context can be shared safely.
        object.__setattr__(self, "history", tuple(self.history))
        object.__setattr__(self, "org_keywords", _freeze_keywords(self.org_keywords))

    @property
    def zone(self) -> ZoneInfo:
        """The org's timezone."""
        return ZoneInfo(self.timezone)


@dataclass(frozen=True)
class Classification:
    """The class of a reply; `label` None means no declared class was recognised."""

    label: str | None
    llm_calls: int
    reason: str


@dataclass(frozen=True)
class Written:
    """A follow-up message; `text` None means "send the node's template fallback"."""

    text: str | None
    llm_calls: int
    reason: str


@dataclass(frozen=True)
class SmartWait:
    """A `wait` node in smart mode: the model picks a duration within [min, max] minutes."""

    node_id: str
    min_minutes: int
    max_minutes: int
    guidance: str | None = None

    def __post_init__(self) -> None:
        if self.min_minutes > self.max_minutes:
            raise ValueError(f"wait {self.node_id!r}: min_minutes is above max_minutes")


@dataclass(frozen=True)
class PlannedWait:
    """The duration proposed for one smart wait, as proposed (the runtime clamps it), and a short
    pt-BR sentence (≤ 200 characters) that tells the operator why."""

    node_id: str
    proposed_minutes: int
    reason: str


@dataclass(frozen=True)
class Plan:
    """Proposed durations by node id. A smart wait missing here waits its maximum."""

    waits: Mapping[str, PlannedWait]
    llm_calls: int
    reason: str


@runtime_checkable
class AI(Protocol):
    """The classifier, writer, timing planner and reader of follow-up flows."""

    def classify(
        self,
        *,
        text: str,
        classes: Sequence[str],
        keywords: Mapping[str, Sequence[str]],
        hint: str | None,
        context: AIContext,
        labels: Mapping[str, str] | None = None,
    ) -> Classification:
        """Which of `classes` the patient's reply `text` is, or label None. `keywords` are the
        node's own keyword lists by class; `hint` the operator's note on the node; `labels` the
        builder's name of each class ("Não quer" for `nao_quer`), which describes it: the answer
        is still the class itself."""
        ...

    def write(self, *, prompt_hint: str, max_chars: int, context: AIContext) -> Written:
        """A follow-up message of at most `max_chars` characters, or text None (template)."""
        ...

    def plan(self, *, waits: Sequence[SmartWait], context: AIContext) -> Plan:
        """Durations for all of a flow's smart waits at once."""
        ...

    def understand(self, text: str, context: Context) -> Understanding:
        """What a reply means (intent, date, time, period…): the built-in reader's answer, or
        the model's when it gives one that fits the schema (engine/flows/ai/understand.py)."""
        ...


def clamp(minutes: int, wait: SmartWait) -> int:
    """`minutes` forced into [wait.min_minutes, wait.max_minutes].

    Plans keep what the model proposed; the runtime clamps when it stores a plan and again when
    it reads one, so a flow edited after planning still honours its current bounds.
    """
    return max(wait.min_minutes, min(wait.max_minutes, int(minutes)))
