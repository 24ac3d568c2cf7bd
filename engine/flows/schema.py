"""The shape of a flow (docs/flows.md, "The graph"): marshmallow schemas of the graph, of every
node type's `config` and of the flow's trigger config. They are the only validator of that
shape; `json_schema()` derives the builder's JSON Schema from them.

Two levels of checking:

- `check_draft`: what every auto-save of the builder must satisfy (nodes and edges well formed);
  node configs may still be incomplete.
- `normalize_node_config` / `normalize_graph` / `load_trigger_config`: complete, valid configs
  with their defaults filled, as a published version freezes them.

A failed load raises `ConfigError` (a `marshmallow.ValidationError`) whose `problems` say, per
field, what the field accepts as a short pt-BR phrase from the catalogue (`detail_*` codes), so
a person never reads marshmallow's English.
"""

from __future__ import annotations

import copy
import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from apispec.ext.marshmallow.field_converter import DEFAULT_FIELD_MAPPING
from apispec.ext.marshmallow.openapi import OpenAPIConverter
from marshmallow import EXCLUDE, RAISE, Schema, ValidationError, fields, validate, validates_schema

from engine.words.catalogue import describe
from engine.flows import conditions
from engine.core.fields import WholeNumber
from engine.flows.issues import FlowIssue, bounded, sort_issues
from engine.core.strict_json import find_problem, storable_text
from engine.words.texts import Text

# --- limits (docs/flows.md) ---------------------------------------------------------------------

MAX_MINUTES = 129_600  # 90 days
MIN_WAIT_MINUTES = 5
MIN_GRACE_MINUTES = 15
MAX_NODES = 200
MAX_EDGES = 400
MAX_CLASSES = 10
MAX_KEYWORDS = 20
#: A class's name as the clinic wrote it ("Não quer"); the class itself is the slug the engine reads.
MAX_CLASS_LABEL = 60
MAX_CONDITIONS = conditions.MAX_CHECKS
#: An `ask` node: how many fields it may collect, and how many times it may ask for one.
MAX_ASK_FIELDS = 10
MAX_ASKS = 5
ASK_PHRASINGS = ("question", "ai")

NODE_TYPES = ("trigger", "wait", "condition", "ai_classify", "ask", "action", "do", "end")
EDGE_CONDITIONS = ("always", "class_match", "cond_result", "no_reply", "replied", "complete", "gave_up", "ok",
                   "failed", "unavailable")
#: What a `do` node does (engine/flows/actions/node.py).
DO_ACTIONS = ("confirm", "cancel", "move", "book", "offer_slots", "notify_staff", "handoff", "set_stage", "start_flow",
              "notify_clinic")
#: An `offer_slots` list: how many free times it may offer, how many times it may be sent.
MAX_OFFERED = 10
MAX_OFFERS = 5
CHANNEL_KINDS = ("whatsapp", "sms", "email")  # also the default order of `channel_kinds`
OUTCOMES = ("converted", "exhausted", "custom")
TRIGGER_KINDS = ("manual", "appointment", "event", "silence", "reminder_no_reply", "handoff_ended", "intent")
#: The intents of a patient's free text that may start a flow (engine.words.understanding).
TRIGGER_INTENTS = ("reschedule", "cancel", "confirm", "question", "human")
APPOINTMENT_EVENTS = ("created", "confirmed", "cancelled", "completed", "no_show")
CONTACT_EVENTS = ("stage_changed",)
REPEAT_POLICIES = ("once", "always", "cooldown")
#: The class name the `no_reply` edge stands for; a classify node may not declare it.
NO_REPLY = "no_reply"

NODE_ID = r"^[A-Za-z0-9_-]{1,64}$"
CLASS_SLUG = r"^[a-z][a-z0-9_]{0,39}$"
TEMPLATE_KEY = r"^[a-z][a-z0-9_]{0,63}$"

#: What an edge condition's `value` must be: None means "no value".
EDGE_VALUE_TYPES: Mapping[str, type | None] = {
    "always": None, "class_match": str, "cond_result": bool, "no_reply": None, "replied": None,
    "complete": None, "gave_up": None, "ok": None, "failed": None, "unavailable": None,
}

# The messages of the rules marshmallow has no words for. They stay English for developers;
# `_CUSTOM_DETAILS` says what a person reads instead.
MSG_REPEATED = "Items must not repeat."
MSG_RESERVED_CLASS = "no_reply is reserved for the no-reply edge."
MSG_MIN_OVER_MAX = "min_minutes must not exceed max_minutes."
MSG_KEYWORD_CLASS = "Keywords are only for the classes listed in classes."
MSG_LABEL_CLASS = "Labels are only for the classes listed in classes."
MSG_COOLDOWN_REQUIRED = "Required when repeat is cooldown."
MSG_COOLDOWN_FORBIDDEN = "Only allowed when repeat is cooldown."
MSG_OP_NOT_ALLOWED = "This op is not allowed for this field."
MSG_CHECK_VALUE = "Not a valid value for this op."
MSG_EDGE_VALUE = "Not a valid value for this condition type."
MSG_UNSTORABLE = "Must not contain NUL characters or lone surrogates."


# --- fields and validators ----------------------------------------------------------------------

class PlainText(fields.String):
    """A string both databases can store inside JSON: no NUL, no lone surrogates (PostgreSQL's
    jsonb refuses `\\u0000`, so one stray character would make an auto-save fail)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        result = super()._deserialize(value, attr, data, **kwargs)
        if not storable_text(result):
            raise ValidationError(MSG_UNSTORABLE)
        return result


class Coordinate(fields.Raw):
    """A finite JSON number, kept exactly as given (the builder's canvas position)."""

    default_error_messages: ClassVar[dict[str, str]] = {"invalid": "Not a valid number."}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.make_error("invalid")
        return value


class FullMatch(validate.Regexp):
    """Regexp that must match the whole string: Python's `$` also matches before a final
    newline, so `"abc\\n"` would pass a plain `Regexp("^[a-z]+$")`."""

    def __call__(self, value: Any) -> Any:
        if self.regex.fullmatch(value) is None:
            raise ValidationError(self._format_error(value))
        return value


class Unique(validate.Validator):
    """No item of the list appears twice."""

    error = MSG_REPEATED

    def __call__(self, value: Any) -> Any:
        if len(set(value)) != len(value):
            raise ValidationError(self.error)
        return value


def _minutes(low: int, *, required: bool = True, **kwargs: Any) -> WholeNumber:
    return WholeNumber(required=required, validate=validate.Range(low, MAX_MINUTES), **kwargs)


def _text(max_length: int, **kwargs: Any) -> PlainText:
    return PlainText(validate=validate.Length(max=max_length), **kwargs)


def _template_key(**kwargs: Any) -> PlainText:
    return PlainText(validate=FullMatch(TEMPLATE_KEY), metadata={"detail": ("detail_slug", {"max": 64})}, **kwargs)


def _const(value: str) -> fields.String:
    """The field that tells one shape of a config from the others (`mode`, `kind`)."""
    return fields.String(required=True, validate=validate.Equal(value))


def _channel_kinds() -> fields.List:
    return fields.List(fields.String(validate=validate.OneOf(CHANNEL_KINDS)), load_default=lambda: list(CHANNEL_KINDS),
                       validate=[validate.Length(1, len(CHANNEL_KINDS)), Unique()])


class _Strict(Schema):
    class Meta:
        unknown = RAISE


# --- node configs -------------------------------------------------------------------------------

class TriggerNodeConfig(_Strict):
    """The trigger node holds nothing: the trigger is the flow's `trigger_config`."""


class FixedWaitConfig(_Strict):
    mode = _const("fixed")
    minutes = _minutes(MIN_WAIT_MINUTES)


class SmartWaitConfig(_Strict):
    mode = _const("smart")
    min_minutes = _minutes(MIN_WAIT_MINUTES)
    max_minutes = _minutes(MIN_WAIT_MINUTES)
    guidance = _text(500, load_default="")

    @validates_schema
    def _min_not_over_max(self, data: Mapping[str, Any], **kwargs: Any) -> None:
        if data["min_minutes"] > data["max_minutes"]:
            raise ValidationError(MSG_MIN_OVER_MAX, "max_minutes")


class CheckConfig(_Strict):
    """One check of a condition node or of a trigger's conditions (see `conditions.py`)."""

    field = fields.String(required=True, validate=validate.OneOf(tuple(conditions.FIELDS)))
    op = fields.String(required=True, validate=validate.OneOf(conditions.OPS))
    value = fields.Raw(allow_none=True, load_default=None)

    @validates_schema
    def _fits_field(self, data: Mapping[str, Any], **kwargs: Any) -> None:
        problem = conditions.check_problem(data["field"], data["op"], data["value"])
        if problem == "op":
            raise ValidationError(MSG_OP_NOT_ALLOWED, "op")
        if problem == "value":
            raise ValidationError(MSG_CHECK_VALUE, "value")


class ConditionConfig(_Strict):
    checks = fields.List(fields.Nested(CheckConfig), required=True, validate=validate.Length(1, MAX_CONDITIONS))
    combinator = fields.String(load_default="all", validate=validate.OneOf(conditions.COMBINATORS))


class ClassifyConfig(_Strict):
    classes = fields.List(
        PlainText(validate=[FullMatch(CLASS_SLUG), validate.NoneOf([NO_REPLY], error=MSG_RESERVED_CLASS)],
                  metadata={"detail": ("detail_slug", {"max": 40})}),
        required=True, validate=[validate.Length(1, MAX_CLASSES), Unique()])
    grace_minutes = _minutes(MIN_GRACE_MINUTES)
    hint = _text(500, load_default="")
    keywords = fields.Dict(keys=PlainText(),
                           values=fields.List(PlainText(validate=validate.Length(1, 60)),
                                              validate=validate.Length(max=MAX_KEYWORDS)),
                           load_default=dict)
    # The builder's names of the classes, by slug: shown instead of the slug, never read by the
    # engine. Optional and without a default, so a config without names normalizes as before.
    labels = fields.Dict(keys=PlainText(), values=PlainText(validate=validate.Length(1, MAX_CLASS_LABEL)))

    @validates_schema
    def _keywords_of_declared_classes(self, data: Mapping[str, Any], **kwargs: Any) -> None:
        if set(data["keywords"]) - set(data["classes"]):
            raise ValidationError(MSG_KEYWORD_CLASS, "keywords")
        if set(data.get("labels", {})) - set(data["classes"]):
            raise ValidationError(MSG_LABEL_CLASS, "labels")


class AskConfig(_Strict):
    """Collect the org's conversation `fields` (engine/flows/conversation/fields.py), asking for
    each one still unknown at most `max_asks` times; `grace_minutes` is how long each question
    waits for its answer. `phrasing`: the field's own question, or the question as the AI puts it."""

    fields_ = fields.List(
        PlainText(validate=FullMatch(CLASS_SLUG), metadata={"detail": ("detail_slug", {"max": 40})}),
        required=True, data_key="fields", attribute="fields", validate=[validate.Length(1, MAX_ASK_FIELDS), Unique()])
    max_asks = WholeNumber(load_default=3, validate=validate.Range(1, MAX_ASKS))
    grace_minutes = _minutes(MIN_GRACE_MINUTES, required=False, load_default=240)
    phrasing = fields.String(load_default="question", validate=validate.OneOf(ASK_PHRASINGS))
    channel_kinds = _channel_kinds()


class TemplateActionConfig(_Strict):
    mode = _const("template")
    template = _template_key(required=True)
    channel_kinds = _channel_kinds()


class AiMessageActionConfig(_Strict):
    mode = _const("ai_message")
    prompt_hint = _text(1000, load_default="")
    fallback_template = _template_key(load_default=None, allow_none=True)
    max_chars = WholeNumber(load_default=600, validate=validate.Range(1, 1000))
    channel_kinds = _channel_kinds()


def _field_slug() -> PlainText:
    """A conversation field the action reads its value from (optional)."""
    return PlainText(validate=FullMatch(CLASS_SLUG), load_default=None, allow_none=True,
                     metadata={"detail": ("detail_slug", {"max": 40})})


class DoAppointmentConfig(_Strict):
    """`confirm` or `cancel` the run's appointment."""

    action = fields.String(required=True, validate=validate.OneOf(("confirm", "cancel")))


class DoTakeSlotConfig(_Strict):
    """`move` the run's appointment or `book` a new one: to the slot picked from an offer, else to
    the collected `date_field` and `time_field`."""

    action = fields.String(required=True, validate=validate.OneOf(("move", "book")))
    date_field = _field_slug()
    time_field = _field_slug()


class DoOfferSlotsConfig(_Strict):
    """Offer up to `limit` free times matching the collected date, period and time; the reply
    picks one. The list is sent at most `max_asks` times; each waits `grace_minutes`."""

    action = _const("offer_slots")
    limit = WholeNumber(load_default=3, validate=validate.Range(1, MAX_OFFERED))
    date_field = _field_slug()
    period_field = _field_slug()
    time_field = _field_slug()
    same_professional = fields.Boolean(load_default=True)
    intro = _text(300, load_default="Tenho estes horários livres:")
    outro = _text(300, load_default="Responda com o número do horário que preferir.")
    max_asks = WholeNumber(load_default=2, validate=validate.Range(1, MAX_OFFERS))
    grace_minutes = _minutes(MIN_GRACE_MINUTES, required=False, load_default=240)
    channel_kinds = _channel_kinds()


class DoNotifyStaffConfig(_Strict):
    """A Pendências item for the clinic's staff, with the node's `note` (no patient data)."""

    action = _const("notify_staff")
    note = _text(200, required=True)


class DoHandoffConfig(_Strict):
    """The conversation goes to a person (the flow's hand-off policy)."""

    action = _const("handoff")


class DoSetStageConfig(_Strict):
    """The contact moves to `stage` of the clinic's funnel (a `stage_changed` event: the flows
    waiting for that stage start)."""

    action = _const("set_stage")
    stage = PlainText(required=True, validate=validate.Length(1, 200))


class DoStartFlowConfig(_Strict):
    """Start another of the org's flows for the contact (its trigger's repeat policy holds)."""

    action = _const("start_flow")
    flow_id = WholeNumber(required=True, validate=validate.Range(min=1))


class DoNotifyClinicConfig(_Strict):
    """Tell the clinic's own system (the `run.notified` webhook event) `signal`, with what the run
    collected that carries no personal data."""

    action = _const("notify_clinic")
    signal = PlainText(required=True, validate=FullMatch(CLASS_SLUG), metadata={"detail": ("detail_slug", {"max": 40})})


class EndConfig(_Strict):
    outcome = fields.String(required=True, validate=validate.OneOf(OUTCOMES))
    note = _text(200, load_default="")


#: The config shapes of each node type, by `mode` (None: the type has a single shape).
NODE_CONFIGS: Mapping[str, Mapping[str | None, type[Schema]]] = {
    "trigger": {None: TriggerNodeConfig},
    "wait": {"fixed": FixedWaitConfig, "smart": SmartWaitConfig},
    "condition": {None: ConditionConfig},
    "ai_classify": {None: ClassifyConfig},
    "ask": {None: AskConfig},
    "action": {"template": TemplateActionConfig, "ai_message": AiMessageActionConfig},
    "do": {"confirm": DoAppointmentConfig, "cancel": DoAppointmentConfig, "move": DoTakeSlotConfig,
           "book": DoTakeSlotConfig, "offer_slots": DoOfferSlotsConfig, "notify_staff": DoNotifyStaffConfig,
           "handoff": DoHandoffConfig, "set_stage": DoSetStageConfig, "start_flow": DoStartFlowConfig,
           "notify_clinic": DoNotifyClinicConfig},
    "end": {None: EndConfig},
}
#: The field that picks a node's config shape, where the type has several.
NODE_SELECTORS: Mapping[str, str] = {"do": "action"}


# --- trigger config -----------------------------------------------------------------------------

class _TriggerConfig(_Strict):
    repeat = fields.String(load_default="once", validate=validate.OneOf(REPEAT_POLICIES))
    cooldown_minutes = WholeNumber(load_default=None, allow_none=True,
                                   validate=validate.Range(min=MIN_WAIT_MINUTES))
    conditions = fields.List(fields.Nested(CheckConfig), load_default=list,
                             validate=validate.Length(max=MAX_CONDITIONS))

    @validates_schema
    def _cooldown_iff_repeat_cooldown(self, data: Mapping[str, Any], **kwargs: Any) -> None:
        cooldown = data["repeat"] == "cooldown"
        if cooldown and data["cooldown_minutes"] is None:
            raise ValidationError(MSG_COOLDOWN_REQUIRED, "cooldown_minutes")
        if not cooldown and data["cooldown_minutes"] is not None:
            raise ValidationError(MSG_COOLDOWN_FORBIDDEN, "cooldown_minutes")


class ManualTrigger(_TriggerConfig):
    kind = _const("manual")


class AppointmentTrigger(_TriggerConfig):
    kind = _const("appointment")
    appointment_event = fields.String(required=True, validate=validate.OneOf(APPOINTMENT_EVENTS))


class IntentTrigger(_TriggerConfig):
    """A patient's free text read (by the built-in reader) as this intent, when no run is talking
    with them: "posso remarcar para sexta?" starts the org's `reschedule` flow."""

    kind = _const("intent")
    intent = fields.String(required=True, validate=validate.OneOf(TRIGGER_INTENTS))


class EventTrigger(_TriggerConfig):
    kind = _const("event")
    event = fields.String(required=True, validate=validate.OneOf(CONTACT_EVENTS))
    stage = PlainText(load_default=None, allow_none=True, validate=validate.Length(1, 200))


class SilenceTrigger(_TriggerConfig):
    kind = _const("silence")
    minutes = _minutes(MIN_WAIT_MINUTES)


class ReminderNoReplyTrigger(_TriggerConfig):
    kind = _const("reminder_no_reply")
    minutes = _minutes(MIN_WAIT_MINUTES)


class HandoffEndedTrigger(_TriggerConfig):
    kind = _const("handoff_ended")


#: The trigger config's shape per `kind`; a kind accepts its own params only.
TRIGGER_CONFIGS: Mapping[str, type[Schema]] = {
    "manual": ManualTrigger, "appointment": AppointmentTrigger, "event": EventTrigger,
    "silence": SilenceTrigger, "reminder_no_reply": ReminderNoReplyTrigger, "handoff_ended": HandoffEndedTrigger,
    "intent": IntentTrigger,
}


# --- the graph ----------------------------------------------------------------------------------

class PositionSchema(_Strict):
    x = Coordinate(required=True)
    y = Coordinate(required=True)


class NodeSchema(_Strict):
    """A node as the builder saves it; `config` is only required to be an object here."""

    id = PlainText(required=True, validate=FullMatch(NODE_ID), metadata={"detail": ("detail_node_id", {})})
    type = fields.String(required=True, validate=validate.OneOf(NODE_TYPES))
    label = _text(120)
    position = fields.Nested(PositionSchema)
    config = fields.Dict(required=True)


class EdgeConditionSchema(_Strict):
    type = fields.String(required=True, validate=validate.OneOf(EDGE_CONDITIONS))
    value = fields.Raw(allow_none=True)

    @validates_schema
    def _value_fits_type(self, data: Mapping[str, Any], **kwargs: Any) -> None:
        if not edge_value_fits(data["type"], data.get("value")):
            raise ValidationError(MSG_EDGE_VALUE, "value")


class EdgeSchema(_Strict):
    id = _text(64)
    source = PlainText(required=True)
    target = PlainText(required=True)
    condition = fields.Nested(EdgeConditionSchema, required=True)
    priority = WholeNumber()


class GraphSchema(_Strict):
    nodes = fields.List(fields.Nested(NodeSchema), required=True, validate=validate.Length(max=MAX_NODES))
    edges = fields.List(fields.Nested(EdgeSchema), required=True, validate=validate.Length(max=MAX_EDGES))


def edge_value_fits(condition_type: str, value: Any) -> bool:
    """Whether `value` suits an edge condition of this type: a class name for `class_match`,
    true/false for `cond_result`, nothing (absent or null) for the others."""
    expected = EDGE_VALUE_TYPES[condition_type]
    if expected is None:
        return value is None
    return type(value) is expected  # exact: True is an int, and an int is no class name


# --- what a person reads about a failed load ----------------------------------------------------

@dataclass(frozen=True)
class Problem:
    """One field that does not fit: `path` from the loaded object, `detail` what it accepts."""

    path: tuple[str | int, ...]
    detail: Text

    def field(self, root: str) -> str:
        """The dotted path (`checks.0.op`), or `root` for the object itself."""
        return ".".join(str(part) for part in self.path) or root


class ConfigError(ValidationError):
    """A ValidationError that also says, per field, what a person should read."""

    def __init__(self, messages: Any, problems: Sequence[Problem]) -> None:
        super().__init__(messages)
        self.problems: list[Problem] = list(problems)


def _value_detail(kind: conditions.ValueKind) -> Text:
    return {
        "none": lambda: describe("detail_no_value"),
        "text": lambda: describe("detail_text", max=conditions.MAX_TEXT_VALUE),
        "texts": lambda: describe("detail_list", min=1, max=conditions.MAX_LIST_VALUES),
        "number": lambda: describe("detail_number"),
        "minutes": lambda: describe("detail_integer_min", min=1),
    }[kind]()


def _edge_value_detail(condition_type: str) -> Text:
    expected = EDGE_VALUE_TYPES[condition_type]
    if expected is str:
        return describe("detail_class_value")
    return describe("detail_boolean") if expected is bool else describe("detail_no_value")


# Each takes the object the message was raised on (its other fields are valid by then).
_CUSTOM_DETAILS: Mapping[str, Callable[[Mapping[str, Any]], Text]] = {
    MSG_REPEATED: lambda data: describe("detail_repeated"),
    MSG_RESERVED_CLASS: lambda data: describe("detail_reserved_class"),
    MSG_MIN_OVER_MAX: lambda data: describe("detail_min_over_max"),
    MSG_KEYWORD_CLASS: lambda data: describe("detail_keyword_class"),
    MSG_LABEL_CLASS: lambda data: describe("detail_label_class"),
    MSG_COOLDOWN_REQUIRED: lambda data: describe("detail_cooldown_required"),
    MSG_COOLDOWN_FORBIDDEN: lambda data: describe("detail_cooldown_forbidden"),
    MSG_OP_NOT_ALLOWED: lambda data: describe("detail_choice", choices=", ".join(conditions.FIELDS[data["field"]].ops)),
    MSG_CHECK_VALUE: lambda data: _value_detail(conditions.value_kind(data["field"], data["op"])),
    MSG_EDGE_VALUE: lambda data: _edge_value_detail(data["type"]),
    MSG_UNSTORABLE: lambda data: describe("detail_unstorable"),
}

#: Every detail code this module can put in a Problem (tests check the catalogue has them).
DETAIL_CODES = (
    "detail_required", "detail_unknown_field", "detail_invalid", "detail_object", "detail_integer",
    "detail_integer_range", "detail_integer_min", "detail_number", "detail_boolean", "detail_text",
    "detail_text_range", "detail_text_any", "detail_choice", "detail_list", "detail_too_many", "detail_repeated",
    "detail_slug", "detail_node_id", "detail_reserved_class", "detail_min_over_max", "detail_keyword_class",
    "detail_cooldown_required", "detail_cooldown_forbidden", "detail_no_value", "detail_class_value",
    "detail_unstorable", "detail_label_class",
)


def _validator(field: fields.Field, kind: type) -> Any:
    return next((v for v in field.validators if isinstance(v, kind)), None)


def _rule(field: fields.Field) -> Text:
    """What a field accepts, in words: said whichever of its checks failed, because that is
    what the person needs to fix it."""
    if "detail" in field.metadata:
        code, params = field.metadata["detail"]
        return describe(code, **params)
    choice = _validator(field, validate.OneOf)
    if choice is not None:
        return describe("detail_choice", choices=", ".join(map(str, choice.choices)))
    equal = _validator(field, validate.Equal)
    if equal is not None:
        return describe("detail_choice", choices=str(equal.comparable))
    length = _validator(field, validate.Length)
    if isinstance(field, fields.Integer):
        span = _validator(field, validate.Range)
        if span is None or span.min is None:
            return describe("detail_integer")
        if span.max is None:
            return describe("detail_integer_min", min=span.min)
        return describe("detail_integer_range", min=span.min, max=span.max)
    if isinstance(field, (fields.Number, Coordinate)):
        return describe("detail_number")
    if isinstance(field, fields.Boolean):
        return describe("detail_boolean")
    if isinstance(field, fields.String):
        if length is None or length.max is None:
            return describe("detail_text_any")
        if length.min:
            return describe("detail_text_range", min=length.min, max=length.max)
        return describe("detail_text", max=length.max)
    if isinstance(field, fields.List) and length is not None:
        if length.min:
            return describe("detail_list", min=length.min, max=length.max)
        return describe("detail_too_many", max=length.max)
    if isinstance(field, (fields.Dict, fields.Nested)):
        return describe("detail_object")
    return describe("detail_invalid")


_MISSING = object()


def _leaf(field: fields.Field, value: Any, messages: Sequence[Any], data: Any) -> Text:
    for message in messages:
        if isinstance(message, str) and message in _CUSTOM_DETAILS:
            return _CUSTOM_DETAILS[message](data if isinstance(data, Mapping) else {})
    if value is _MISSING or (value is None and not field.allow_none):
        return describe("detail_required")
    return _rule(field)


def _item(container: Any, key: Any) -> Any:
    try:
        return container[key]
    except (KeyError, IndexError, TypeError):
        return _MISSING


def _explain_field(field: fields.Field, value: Any, messages: Any, path: tuple[str | int, ...],
                   data: Any) -> list[Problem]:
    if not isinstance(messages, Mapping):
        return [Problem(path, _leaf(field, value, messages, data))]
    if isinstance(field, fields.Nested):
        return _explain_schema(field.schema, value, messages, path)
    problems: list[Problem] = []
    if isinstance(field, fields.List):
        for index, sub in messages.items():
            problems += _explain_field(field.inner, _item(value, index), sub, (*path, index), value)
    elif isinstance(field, fields.Dict):
        for key, sub in messages.items():
            if "key" in sub and field.key_field is not None:
                problems += _explain_field(field.key_field, key, sub["key"], (*path, key), value)
            if "value" in sub and field.value_field is not None:
                problems += _explain_field(field.value_field, _item(value, key), sub["value"], (*path, key), value)
    return problems or [Problem(path, describe("detail_invalid"))]


def _explain_schema(schema: Schema, data: Any, messages: Mapping[Any, Any],
                    path: tuple[str | int, ...] = ()) -> list[Problem]:
    """Turn marshmallow's nested error messages into one Problem per offending field."""
    declared = {field.data_key or name: field for name, field in schema.load_fields.items()}
    problems: list[Problem] = []
    for key, sub in messages.items():
        if key == "_schema":
            detail = describe("detail_object") if not isinstance(data, Mapping) else describe("detail_invalid")
            problems.append(Problem(path, detail))
        elif key not in declared:
            problems.append(Problem((*path, key), describe("detail_unknown_field")))
        else:
            problems += _explain_field(declared[key], _item(data, key), sub, (*path, key), data)
    return problems


def _load(schema: Schema, data: Any) -> dict[str, Any]:
    try:
        return schema.load(copy.deepcopy(data))  # deep: Raw fields would otherwise share the caller's lists
    except ValidationError as error:
        raise ConfigError(error.messages, _explain_schema(schema, data, error.messages)) from None


@functools.cache
def _selector(name: str, options: tuple[str, ...]) -> type[Schema]:
    """A schema of the one field that picks a config's shape."""
    return Schema.from_dict({name: fields.String(required=True, validate=validate.OneOf(options))},
                            name=f"{name.title()}Selector")


def _pick(shapes: Mapping[str | None, type[Schema]], data: Any, selector: str) -> Schema:
    """The schema for `data` among `shapes`, chosen by its `selector` field (`mode`, `kind`)."""
    if None in shapes:
        return shapes[None]()
    if not isinstance(data, Mapping):
        raise ConfigError({"_schema": ["Invalid input type."]}, [Problem((), describe("detail_object"))])
    # EXCLUDE: only the selector is looked at here; the chosen schema reports everything else.
    _load(_selector(selector, tuple(key for key in shapes if key is not None))(unknown=EXCLUDE), data)
    return shapes[data[selector]]()


# --- public API ---------------------------------------------------------------------------------

def normalize_node_config(node_type: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The node's config validated against its type's schema, with every default filled in.

    Raises `ConfigError` (a `marshmallow.ValidationError`; its `problems` explain each field)
    when the config does not fit, and ValueError for a node type that does not exist."""
    if node_type not in NODE_CONFIGS:
        raise ValueError(f"unknown node type {node_type!r}")
    _storable(config)
    shapes = NODE_CONFIGS[node_type]
    return _load(_pick(shapes, config, NODE_SELECTORS.get(node_type, "mode")), config)


def load_trigger_config(data: Any) -> dict[str, Any]:
    """The flow's trigger config validated, with its defaults (`repeat: once`, no cooldown, no
    conditions, no stage) filled in. Raises `ConfigError` (a `marshmallow.ValidationError`)."""
    _storable(data)
    return _load(_pick(TRIGGER_CONFIGS, data, "kind"), data)


def _storable(data: Any) -> None:
    """ConfigError unless `data` is JSON both databases store, nested within bounds: checked before
    the schemas look at it (and deep-copy it, recursively)."""
    problem = find_problem(data)
    if problem is not None:
        raise ConfigError({"_schema": [MSG_UNSTORABLE]}, [Problem(problem.path, problem.detail)])


def check_draft(graph: Any) -> list[FlowIssue]:
    """The issues of the graph's shape only, as every auto-save of the builder must satisfy: an
    object with `nodes` and `edges` lists (≤ 200 / ≤ 400), nodes with valid unique ids, known
    types, an object `config` and numeric positions, edges with source/target strings and a
    known condition, and nothing a database cannot store (engine.core.strict_json: NUL, lone surrogates,
    NaN, numbers past 64 bits, nesting past MAX_DEPTH). Node configs are NOT checked otherwise (a
    draft is work in progress).

    Codes: `invalid_graph`, `invalid_node`, `invalid_edge` (params field, detail) and
    `duplicate_node_id` (params count), at most MAX_ISSUES of them and then `more_issues`. An
    empty list means the draft can be saved."""
    if not isinstance(graph, Mapping):
        return [FlowIssue(None, "invalid_graph", {"field": "graph", "detail": describe("detail_object")})]
    oversized = _oversized(graph)
    if oversized:
        # Do not walk a huge list item by item: the size alone is the problem to fix.
        return oversized
    unstorable = find_problem(graph)
    if unstorable is not None:
        # One is enough: the draft cannot be saved until it is gone, whatever else is wrong with it.
        return [_draft_issue(graph, Problem(unstorable.path, unstorable.detail))]
    schema = GraphSchema()
    try:
        schema.load(graph)
        problems: list[Problem] = []
    except ValidationError as error:
        problems = _explain_schema(schema, graph, error.messages)
    issues = [_draft_issue(graph, problem) for problem in problems] + _duplicate_ids(graph)
    return bounded(sort_issues(issues, node_ids(graph)))


def normalize_graph(graph: Any) -> dict[str, Any]:
    """The graph as a published version freezes it: the same nodes and edges, with each node's
    config normalized (defaults filled in); ids, labels, positions and edges are kept exactly as
    given. Raises `marshmallow.ValidationError` when the draft's shape or any config is invalid."""
    issues = check_draft(graph)
    if issues:
        raise ValidationError({"graph": [issue.as_dict() for issue in issues]})
    loaded = GraphSchema().load(graph)
    errors: dict[int, Any] = {}
    for index, node in enumerate(loaded["nodes"]):
        try:
            node["config"] = normalize_node_config(node["type"], node["config"])
        except ValidationError as error:
            errors[index] = {"config": error.messages}
    if errors:
        raise ValidationError({"nodes": errors})
    return {"nodes": loaded["nodes"], "edges": loaded["edges"]}


def node_ids(graph: Any) -> list[Any]:
    """The `id` of each node in graph order (whatever it is; None for a node that is no object)."""
    nodes = graph.get("nodes") if isinstance(graph, Mapping) else None
    if not isinstance(nodes, list):
        return []
    return [node.get("id") if isinstance(node, Mapping) else None for node in nodes]


def _oversized(graph: Mapping[str, Any]) -> list[FlowIssue]:
    limits = {"nodes": MAX_NODES, "edges": MAX_EDGES}
    return [FlowIssue(None, "invalid_graph", {"field": key, "detail": describe("detail_too_many", max=limit)})
            for key, limit in limits.items() if isinstance(graph.get(key), list) and len(graph[key]) > limit]


_NODE_ID = re.compile(NODE_ID)


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and _NODE_ID.fullmatch(value) is not None


def _draft_issue(graph: Mapping[str, Any], problem: Problem) -> FlowIssue:
    """The problem as an issue on the node it is about (an edge's: its source node)."""
    params = {"field": problem.field("graph"), "detail": problem.detail}
    where, index = (*problem.path, None, None)[:2]
    if where not in ("nodes", "edges") or not isinstance(index, int):
        return FlowIssue(None, "invalid_graph", params)
    item = _item(graph[where], index)
    item = item if isinstance(item, Mapping) else {}
    if where == "nodes":
        node_id = item.get("id")
        return FlowIssue(node_id if _valid_id(node_id) else None, "invalid_node", params)
    source = item.get("source")
    known = source if _valid_id(source) and source in node_ids(graph) else None
    return FlowIssue(known, "invalid_edge", params)


def _duplicate_ids(graph: Mapping[str, Any]) -> list[FlowIssue]:
    counts = Counter(node_id for node_id in node_ids(graph) if _valid_id(node_id))
    return [FlowIssue(node_id, "duplicate_node_id", {"count": count}) for node_id, count in counts.items()
            if count > 1]


# --- JSON Schema ----------------------------------------------------------------------------------

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Nested schemas written as a reference to a `$defs` entry instead of inline: the ones
# `json_schema()` describes itself (their rules are conditional on another field's value).
_REFERENCED: Mapping[type[Schema], str] = {
    CheckConfig: "check", EdgeConditionSchema: "edge_condition", NodeSchema: "node",
}


def _as_reference(self: OpenAPIConverter, field: fields.Field, ret: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    if isinstance(field, fields.Nested) and field.nested in _REFERENCED:
        ret.clear()  # drop the inline copy nested2properties made
        return {"$ref": f"#/$defs/{_REFERENCED[field.nested]}"}
    return {}


def _unique_items(self: OpenAPIConverter, field: fields.Field, **kwargs: Any) -> dict[str, Any]:
    return {"uniqueItems": True} if _validator(field, Unique) is not None else {}


def _none_of(self: OpenAPIConverter, field: fields.Field, **kwargs: Any) -> dict[str, Any]:
    refused = _validator(field, validate.NoneOf)
    return {"not": {"enum": list(refused.iterable)}} if refused is not None else {}


def _callable_default(self: OpenAPIConverter, field: fields.Field, **kwargs: Any) -> dict[str, Any]:
    # apispec skips callable defaults (`load_default=list`); they are plain values for a form.
    return {"default": field.load_default()} if callable(field.load_default) else {}


def _converter() -> OpenAPIConverter:
    # OpenAPI 3.1's schema objects are JSON Schema 2020-12 (nullable is `type: [..., "null"]`).
    converter = OpenAPIConverter("3.1.0", schema_name_resolver=lambda schema: None, spec=None)
    converter.field_mapping = {**DEFAULT_FIELD_MAPPING, Coordinate: ("number", None)}  # not the shared dict
    for function in (_as_reference, _unique_items, _none_of, _callable_default):
        converter.add_attribute_function(function)
    return converter


def _shapes(converter: OpenAPIConverter, schemas: Sequence[type[Schema]]) -> dict[str, Any]:
    variants = [converter.schema2jsonschema(schema) for schema in schemas]
    return variants[0] if len(variants) == 1 else {"oneOf": variants}


def _check_json_schema() -> dict[str, Any]:
    """The checks, from the conditions registry: one branch per group of fields sharing their ops
    and per kind of value, so a form can offer the right ops and value input per field."""
    value_schemas: Mapping[str, dict[str, Any]] = {
        "none": {"type": "null"},
        "text": {"type": "string", "maxLength": conditions.MAX_TEXT_VALUE},
        "texts": {"type": "array", "items": {"type": "string", "maxLength": conditions.MAX_TEXT_VALUE},
                  "minItems": 1, "maxItems": conditions.MAX_LIST_VALUES},
        "number": {"type": "number"},
        "minutes": {"type": "integer", "minimum": 1},
    }
    groups: dict[conditions.FieldSpec, list[str]] = {}
    for name, spec in conditions.FIELDS.items():
        groups.setdefault(spec, []).append(name)
    branches = []
    for spec, names in groups.items():
        by_kind: dict[str, list[str]] = {}
        for op in spec.ops:
            by_kind.setdefault(conditions.value_kind(names[0], op), []).append(op)
        for kind, ops in by_kind.items():
            branches.append({
                "type": "object", "x-field-type": spec.type,
                "properties": {"field": {"enum": names}, "op": {"enum": ops}, "value": value_schemas[kind]},
                "required": ["field", "op"] if kind == "none" else ["field", "op", "value"],
                "additionalProperties": False,
            })
    return {"oneOf": branches}


def _edge_condition_json_schema() -> dict[str, Any]:
    json_types = {str: "string", bool: "boolean", None: "null"}
    branches = []
    for expected in (str, bool, None):
        types = [kind for kind, value_type in EDGE_VALUE_TYPES.items() if value_type is expected]
        branches.append({
            "type": "object",
            "properties": {"type": {"enum": types}, "value": {"type": json_types[expected]}},
            "required": ["type"] if expected is None else ["type", "value"],
            "additionalProperties": False,
        })
    return {"oneOf": branches}


def _trigger_json_schema(converter: OpenAPIConverter) -> dict[str, Any]:
    document = _shapes(converter, list(TRIGGER_CONFIGS.values()))
    # The one cross-field rule JSON Schema can say: cooldown_minutes iff repeat is cooldown.
    document.update({
        "if": {"properties": {"repeat": {"const": "cooldown"}}, "required": ["repeat"]},
        "then": {"properties": {"cooldown_minutes": {"type": "integer"}}, "required": ["cooldown_minutes"]},
        "else": {"properties": {"cooldown_minutes": {"type": "null"}}},
    })
    return document


def _node_json_schema(converter: OpenAPIConverter) -> dict[str, Any]:
    node = converter.schema2jsonschema(NodeSchema)
    node["allOf"] = [
        {"if": {"properties": {"type": {"const": node_type}}, "required": ["type"]},
         "then": {"properties": {"config": {"$ref": f"#/$defs/config_{node_type}"}}}}
        for node_type in NODE_TYPES
    ]
    return node


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of a complete flow graph, for the visual builder to build
    its forms from: `$defs` holds each node type's config (`config_<type>`, a `oneOf` of the
    modes where a type has two), the trigger config, the edge conditions and the condition
    checks (fields, their ops and values).

    It is derived from the marshmallow schemas and the conditions registry. Rules JSON Schema
    cannot state are only in marshmallow (the builder learns them from publish issues): a smart
    wait's min ≤ max, keywords only for declared classes, no NUL characters in texts."""
    converter = _converter()
    defs: dict[str, Any] = {
        f"config_{node_type}": _shapes(converter, list(dict.fromkeys(shapes.values())))
        for node_type, shapes in NODE_CONFIGS.items()
    }
    defs.update({
        "trigger_config": _trigger_json_schema(converter),
        "edge_condition": _edge_condition_json_schema(),
        "check": _check_json_schema(),
        "node": _node_json_schema(converter),
    })
    graph = converter.schema2jsonschema(GraphSchema)
    return {"$schema": JSON_SCHEMA_DIALECT, "title": "Lembra follow-up flow graph", **graph, "$defs": defs}
