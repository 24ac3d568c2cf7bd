"""A loopback OpenAI-compatible Chat Completions server (`POST /v1/chat/completions`).

The wire format is OpenAI's, as the `openai` package sends and parses it: the completion object
(`id`, `object: "chat.completion"`, `created`, `model`, `choices[].message`, `finish_reason`,
`usage`) and the error envelope `{"error": {"message", "type", "param", "code"}}` with the
messages and codes OpenAI documents for each status (a 401 echoes a masked key, like OpenAI's).
Ollama and vLLM serve the same shapes under the same paths.

    fake = LLMFake(classify=contains({"sim": "confirm", "sexta": "reschedule"}))
    with serve(fake) as server:                       # or: with LLMFake(...) as fake: fake.base_url
        ai = OpenAICompatAI(f"{server.url}/v1", "sk-test", "llama3")
        ...
    fake.script('{"label": "confirm"}', Error(500), Slow(2.0))  # FIFO; the last one repeats
    fake.calls[0].labels, fake.calls[0].patient_text, len(fake.requests)

Answers, scripted or not, are: a `str` (the message content as is), a `dict`/`list` (content =
its JSON), an `Error(status)`, a `Slow(seconds, answer)`, a `Trickle(interval, answer)` (the
answer's body one byte every `interval` seconds), a `Huge(size)` (a 200 of `size` bytes, streamed),
or a raw `Reply`. `fake.streams` holds the streamed bodies, which say how much the client read. With nothing
scripted, the default answer depends on the request's schema: classify requests (a `label`
enum) get the label the `classify` rule picks from the patient's text; write requests get
`write(call)`; plan requests get `plan(call)`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, Self

from tests.fakes.server import FakeServer, Recorded, Reply, Streamed

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
#: Speech to text (Whisper's wire; self-hosted faster-whisper / whisper.cpp servers serve it too).
TRANSCRIPTION_PATHS = ("/v1/audio/transcriptions", "/audio/transcriptions")

#: OpenAI's error envelope per status: (type, code, message). {key} is the masked key sent.
DOCUMENTED_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "We could not parse the JSON body of your request."),
    401: ("invalid_request_error", "invalid_api_key",
          ("Incorrect API key provided: {key}. You can find your API key at "
           "https://platform.openai.com/account/api-keys.")),
    403: ("request_forbidden", "unsupported_country_region_territory",
          "Country, region, or territory not supported"),
    404: ("invalid_request_error", "model_not_found",
          "The model `{model}` does not exist or you do not have access to it."),
    422: ("invalid_request_error", None, "Unprocessable request."),
    429: ("requests", "rate_limit_exceeded",
          "Rate limit reached for requests. Please try again in 20s."),
    500: ("server_error", None,
          "The server had an error while processing your request. Sorry about that!"),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}


@dataclass(frozen=True)
class Error:
    """An HTTP error with OpenAI's body; message/type/code default to the documented ones."""

    status: int
    message: str | None = None
    type: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class Slow:
    """`answer` after `seconds` (longer than the client's timeout: the client has hung up)."""

    seconds: float
    answer: Answer = '{"label": "none"}'


@dataclass(frozen=True)
class Trickle:
    """`answer` (a whole completion), its body sent one byte every `interval` seconds."""

    interval: float
    answer: Answer = '{"label": "none"}'


@dataclass(frozen=True)
class Huge:
    """A 200 whose body is `size` bytes of JSON whitespace, streamed (never built in memory)."""

    size: int


Answer = str | dict | list | Error | Slow | Trickle | Huge | Reply
#: `rule(patient_text, labels) -> label` (None answers "none"); any string is sent as is, so a
#: rule can also answer a label outside the enum.
ClassifyRule = Callable[[str, Sequence[str]], str | None]


@dataclass(frozen=True)
class TranscriptionCall:
    """One `POST /audio/transcriptions` multipart request, parsed: its form fields and the file."""

    fields: dict[str, str]
    filename: str | None
    audio: bytes
    content_type: str | None


def parse_multipart(request: Recorded) -> TranscriptionCall | None:
    """The multipart/form-data body as OpenAI's client sends it (None when it is not one)."""
    content_type = request.header("Content-Type") or ""
    if not content_type.startswith("multipart/form-data"):
        return None
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + request.body)
    fields: dict[str, str] = {}
    filename, audio, kind = None, b"", None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name == "file":
            filename, audio, kind = part.get_filename(), part.get_payload(decode=True) or b"", part.get_content_type()
        elif isinstance(name, str):
            fields[name] = (part.get_payload(decode=True) or b"").decode("utf-8")
    return TranscriptionCall(fields, filename, audio, kind)


@dataclass
class ChatCall:
    """A chat completion request as the fake understood it."""

    recorded: Recorded
    body: dict[str, Any]

    @property
    def model(self) -> str:
        return self.body.get("model", "")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def temperature(self) -> Any:
        return self.body.get("temperature")

    @property
    def system(self) -> str:
        """The system messages' text, joined."""
        return "\n".join(_text(m) for m in self.messages if m.get("role") in ("system", "developer"))

    @property
    def user_messages(self) -> list[str]:
        return [_text(m) for m in self.messages if m.get("role") == "user"]

    @property
    def quoted(self) -> Any:
        """The last user message parsed as JSON (the quoted data), or None."""
        try:
            return json.loads(self.user_messages[-1])
        except (IndexError, ValueError):
            return None

    @property
    def patient_text(self) -> str | None:
        quoted = self.quoted
        return quoted.get("mensagem_do_paciente") if isinstance(quoted, dict) else None

    @property
    def json_schema(self) -> dict[str, Any]:
        """`response_format.json_schema` (name, strict, schema), or {}."""
        response_format = self.body.get("response_format") or {}
        return response_format.get("json_schema") or {}

    @property
    def schema(self) -> dict[str, Any]:
        return self.json_schema.get("schema") or {}

    @property
    def kind(self) -> str | None:
        """"classify", "write" or "plan", by the properties the schema asks for."""
        properties = self.schema.get("properties") or {}
        for name, kind in (("label", "classify"), ("mensagem", "write"), ("esperas", "plan")):
            if name in properties:
                return kind
        return None

    @property
    def labels(self) -> list[str]:
        """A classify request's enum (declared classes + "none")."""
        return list(self.schema.get("properties", {}).get("label", {}).get("enum", []))

    @property
    def node_ids(self) -> list[str]:
        """A plan request's node id enum."""
        items = self.schema.get("properties", {}).get("esperas", {}).get("items", {})
        return list(items.get("properties", {}).get("node_id", {}).get("enum", []))


def contains(routes: Mapping[str, str]) -> ClassifyRule:
    """A classify rule: the label of the first `routes` key found (case-insensitively) in the
    patient's text, else "none"."""

    def rule(text: str, labels: Sequence[str]) -> str | None:
        lowered = text.lower()
        return next((label for needle, label in routes.items() if needle.lower() in lowered), None)

    return rule


def default_write(call: ChatCall) -> str:
    return "Olá! Passando para saber se podemos ajudar com o seu atendimento."


def default_plan(call: ChatCall) -> list[dict[str, Any]]:
    return [{"node_id": node_id, "minutos": 60, "motivo": "Plano de teste."} for node_id in call.node_ids]


class LLMFake:
    """A scriptable Chat Completions server: a `FakeServer` handler, or its own server in `with`.

    `api_key` (when set) is required as the bearer token, `models` (when set) are the only
    models that exist: both answer as OpenAI does otherwise (401 / 404 model_not_found).
    """

    def __init__(
        self,
        *script: Answer,
        classify: ClassifyRule | None = None,
        write: Callable[[ChatCall], str] = default_write,
        plan: Callable[[ChatCall], list[dict[str, Any]]] = default_plan,
        api_key: str | None = None,
        models: Collection[str] | None = None,
        transcribe: Callable[[bytes], str] = lambda audio: "",
    ) -> None:
        self._script: deque[Answer] = deque(script)
        self.classify_rule: ClassifyRule = classify or (lambda text, labels: None)
        self.write_rule = write
        self.plan_rule = plan
        self.api_key = api_key
        self.models = set(models) if models is not None else None
        self.transcribe_rule = transcribe
        #: Every transcription request, parsed.
        self.transcriptions: list[TranscriptionCall] = []
        #: Every request that reached the fake, any path.
        self.requests: list[Recorded] = []
        #: Every chat completion request, parsed.
        self.calls: list[ChatCall] = []
        #: Every streamed body served (Trickle, Huge), in order.
        self.streams: list[Streamed] = []
        self._server: FakeServer | None = None

    def script(self, *answers: Answer) -> Self:
        """Replace the scripted answers (served in order, the last one repeating)."""
        self._script = deque(answers)
        return self

    # ------------------------------------------------------------------------------ serving

    def __call__(self, request: Recorded) -> Reply:
        self.requests.append(request)
        if request.method == "POST" and request.path in TRANSCRIPTION_PATHS:
            return self._transcription(request)
        if request.method != "POST" or request.path not in CHAT_PATHS:
            return _error(404, f"Invalid URL ({request.method} {request.path})", "invalid_request_error", None)
        if self.api_key is not None and request.header("Authorization") != f"Bearer {self.api_key}":
            return self._answer(Error(401), model="", key=_bearer(request))
        try:
            body = json.loads(request.body)
        except ValueError:
            return self._answer(Error(400), model="")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body.get("messages"):
            return _error(400, "Missing required parameter: 'messages'.", "invalid_request_error",
                          "missing_required_parameter")
        call = ChatCall(request, body)
        self.calls.append(call)
        if self.models is not None and call.model not in self.models:
            return self._answer(Error(404), model=call.model)
        if self._script:
            answer = self._script.popleft() if len(self._script) > 1 else self._script[0]
        else:
            answer = self._default(call)
        return self._answer(answer, model=call.model)

    def _transcription(self, request: Recorded) -> Reply:
        """`{"text": …}` (response_format json): the scripted answer (a `str` is the transcript),
        else `transcribe(audio)`."""
        if self.api_key is not None and request.header("Authorization") != f"Bearer {self.api_key}":
            return self._answer(Error(401), model="", key=_bearer(request))
        call = parse_multipart(request)
        if call is None or not call.audio or "model" not in call.fields:
            return _error(400, "Could not parse multipart form", "invalid_request_error", None)
        self.transcriptions.append(call)
        answer: Answer = (self._script.popleft() if len(self._script) > 1 else self._script[0]) if self._script \
            else self.transcribe_rule(call.audio)
        if isinstance(answer, str):
            return Reply(200, {"text": answer}, headers=_request_id())
        if isinstance(answer, Slow) and isinstance(answer.answer, str):
            return Reply(200, {"text": answer.answer}, headers=_request_id(), delay=answer.seconds)
        return self._answer(answer, model=call.fields["model"])

    def _default(self, call: ChatCall) -> Answer:
        if call.kind == "classify":
            label = self.classify_rule(call.patient_text or "", call.labels)
            return {"label": label if label is not None else "none"}
        if call.kind == "write":
            return {"mensagem": self.write_rule(call)}
        if call.kind == "plan":
            return {"esperas": self.plan_rule(call)}
        return "Olá!"

    def _answer(self, answer: Answer, *, model: str, key: str = "") -> Reply:
        if isinstance(answer, Reply):
            return answer
        if isinstance(answer, Slow):
            reply = self._answer(answer.answer, model=model, key=key)
            return Reply(reply.status, reply.body, reply.headers, delay=answer.seconds)
        if isinstance(answer, (Trickle, Huge)):
            if isinstance(answer, Trickle):
                reply = self._answer(answer.answer, model=model, key=key)
                streamed = Streamed.trickle(reply.encoded(), answer.interval)
                status, headers = reply.status, reply.headers
            else:
                streamed, status, headers = Streamed.huge(answer.size), 200, _request_id()
            self.streams.append(streamed)
            return Reply(status, streamed, headers)
        if isinstance(answer, Error):
            kind, code, message = DOCUMENTED_ERRORS.get(answer.status, ("api_error", None, "Error."))
            return _error(answer.status, answer.message or message.format(key=_mask(key), model=model),
                          answer.type or kind, answer.code or code)
        content = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        return Reply(200, completion(content, model=model), headers=_request_id())

    # ------------------------------------------------------------------------ own server

    def __enter__(self) -> Self:
        self._server = FakeServer(self).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.__exit__(*exc)
        self._server = None

    @property
    def base_url(self) -> str:
        """The `base_url` for clients, when the fake runs its own server."""
        assert self._server is not None, "use `with LLMFake() as fake:` or serve(fake)"
        return f"{self._server.url}/v1"


def completion(content: str, *, model: str, finish_reason: str = "stop") -> dict[str, Any]:
    """A `chat.completion` object whose only choice says `content`."""
    prompt_tokens, completion_tokens = 42, max(1, len(content) // 4)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": None, "annotations": []},
            "logprobs": None,
            "finish_reason": finish_reason,
        }],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "service_tier": "default",
        "system_fingerprint": None,
    }


def _error(status: int, message: str, kind: str, code: str | None) -> Reply:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Reply(status, body, headers=_request_id())


def _request_id() -> dict[str, str]:
    return {"x-request-id": f"req_{uuid.uuid4().hex}"}


def _bearer(request: Recorded) -> str:
    return (request.header("Authorization") or "").removeprefix("Bearer ")


def _mask(key: str) -> str:
    # OpenAI echoes the first and last characters of a rejected key.
    return f"{key[:3]}{'*' * 10}{key[-4:]}" if len(key) > 8 else key


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""
