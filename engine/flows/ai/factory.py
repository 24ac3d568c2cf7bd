"""Which AI an agent gets, and how its LLM key is stored.

An agent with an LLM base URL and model gets `OpenAICompatAI`; anything else (no agent, an agent
without LLM settings) gets `BuiltinAI`. The key is sealed in `agents.llm_api_key`, bound to the
agent's row, so a key copied to another agent or org does not decrypt, and sealed with the
endpoint of the base URL it was typed for, so it is never sent to another one (a base URL changed
by any path that did not clear the key makes it unusable, not readable by the new server).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from engine.flows.ai.base import AI, AIContext, AIError, Classification, Plan, SmartWait, Written
from engine.flows.ai.builtin import BuiltinAI
from engine.flows.ai.openai_compat import OpenAICompatAI
from engine.words.understanding import Context, Understanding
from engine.words.understanding import understand as understand_builtin
from gateway.crypto import CryptoError, Keyring
from gateway.egress import STRICT, EgressPolicy, InvalidAddress, endpoint

__all__ = ["UnavailableAI", "ai_for", "seal_api_key"]

_TABLE = "agents"
#: One client per agent configuration and process (see `ai_for`).
_clients: dict[tuple[Any, ...], AI] = {}
_clients_lock = threading.Lock()
_MAX_CLIENTS = 64


def ai_for(agent: Any | None, keyring: Keyring, *, timeout: float = 20.0, egress: EgressPolicy = STRICT) -> AI:
    """The AI for an `agents` row (or None).

    Never raises for a misconfigured agent: a key that does not decrypt gives an AI whose every
    call raises a permanent `AIError("llm_key_unreadable")`, so the enrollment that needs it
    fails visibly while the worker loop goes on. `egress` is where the agent's LLM URL may
    connect (`Settings.egress`); a refused address fails each call with `egress_refused`.
    """
    base_url = (getattr(agent, "llm_base_url", None) or "").strip()
    model = (getattr(agent, "llm_model", None) or "").strip()
    if agent is None or not base_url or not model:
        return BuiltinAI()
    # Building a client loads the CA bundle into a new SSL context (~50 ms of CPU): once per agent
    # configuration and process, not once per step. The key is part of it, so a new key is a new client.
    sealed = bytes(agent.llm_api_key) if agent.llm_api_key is not None else None
    key = (agent.org_id, agent.id, base_url, model, sealed, agent.key_version, timeout, egress)
    with _clients_lock:
        cached = _clients.get(key)
    if cached is not None:
        return cached
    try:
        endpoint(base_url)  # a URL saved before it was checked: said, never a crash in the client
    except InvalidAddress:
        return UnavailableAI("llm_url_invalid", "the agent's LLM base URL cannot be used")
    try:
        api_key = _open_api_key(agent, keyring, base_url)
    except CryptoError:
        return UnavailableAI("llm_key_unreadable", "the agent's LLM key does not decrypt")
    try:
        ai = OpenAICompatAI(base_url, api_key, model, timeout=timeout, egress=egress)
    except Exception:  # noqa: BLE001 - the client refused the URL: its message may quote it (and its key)
        return UnavailableAI("llm_url_invalid", "the agent's LLM base URL cannot be used")
    with _clients_lock:
        if len(_clients) >= _MAX_CLIENTS:
            _clients.pop(next(iter(_clients)))  # the oldest; a thread still using it keeps it alive
        return _clients.setdefault(key, ai)


def seal_api_key(keyring: Keyring, *, org_id: int, agent_id: int, api_key: str,
                 base_url: str | None) -> tuple[bytes, int]:
    """`(llm_api_key, key_version)` to store on the agent's row, for use with `base_url` only."""
    sealed = keyring.seal({"api_key": api_key, "endpoint": _endpoint_of(base_url)}, table=_TABLE, org_id=org_id,
                          row_id=agent_id)
    return sealed.ciphertext, sealed.key_version


def _endpoint_of(base_url: str | None) -> str | None:
    try:
        where = endpoint(base_url or "")
    except InvalidAddress:
        return None
    return f"{where.scheme}://[{where.host}]:{where.port}" if ":" in where.host else \
        f"{where.scheme}://{where.host}:{where.port}"


def _open_api_key(agent: Any, keyring: Keyring, base_url: str) -> str | None:
    if agent.llm_api_key is None:
        return None  # a server without auth (a local Ollama)
    if agent.key_version is None:
        raise CryptoError("a sealed key without its key version")
    data = keyring.open(agent.llm_api_key, key_version=agent.key_version, table=_TABLE,
                        org_id=agent.org_id, row_id=agent.id)
    key = data.get("api_key") if isinstance(data, dict) else None
    if key is not None and not isinstance(key, str):
        raise CryptoError("the sealed credentials hold no api_key string")
    # A key sealed before keys carried their endpoint has none: it stays with the URL it has.
    if "endpoint" in data and data["endpoint"] != _endpoint_of(base_url):
        raise CryptoError("the key was typed for another endpoint")
    return key or None


class UnavailableAI:
    """An AI that cannot run: every call raises a permanent `AIError` with `code`."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message

    def _fail(self) -> AIError:
        # A fresh exception per call: re-raising one instance would chain its old tracebacks.
        return AIError(self.message, permanent=True, code=self.code)

    def classify(self, *, text: str, classes: Sequence[str], keywords: Mapping[str, Sequence[str]],
                 hint: str | None, context: AIContext, labels: Mapping[str, str] | None = None) -> Classification:
        """Raises the permanent error."""
        raise self._fail()

    def write(self, *, prompt_hint: str, max_chars: int, context: AIContext) -> Written:
        """Raises the permanent error."""
        raise self._fail()

    def plan(self, *, waits: Sequence[SmartWait], context: AIContext) -> Plan:
        """Raises the permanent error."""
        raise self._fail()

    def understand(self, text: str, context: Context) -> Understanding:
        """The built-in reader's answer: no call can be made (`llm_calls=0`), and a reply is
        always read. The agent's problem shows where its calls are made (classify, write, plan)."""
        return understand_builtin(text, context)
