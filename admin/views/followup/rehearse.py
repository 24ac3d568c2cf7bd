"""The builder's "Testar" panel (admin/frontend/src/TestPanel.jsx): a chat beside the canvas that
plays the patient against the draft or the published version of a flow.

`POST /admin/followup/builder/<id>/rehearse` with `{"version": "draft"|"published", "replies": [...]}`
(a reply is a text, or null when the patient stays silent) answers the whole transcript, replayed
from the start by the engine (engine/messaging/rehearsal.py) in a transaction that is always rolled
back: nothing is sent, nothing is kept. The builder's view (builder.py) routes it, checks the role
and the CSRF token as for its writes, and answers the errors; this module reads the body and puts
the transcript in the reader's words (field labels, values, exits, steps).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

from sqlalchemy.engine import Connection

from admin.i18n import _, translate
from admin.views.base import runtime
from admin.views.followup.exits import class_label, exit_label
from admin.views.followup.runs import collected
from engine.flows import queries, versions
from engine.flows.graph import GraphIndex
from engine.messaging.rehearsal import RehearsalRefused, Transcript, rehearse

#: The keys a rehearsal's body may have.
BODY_KEYS = frozenset({"version", "replies"})


def ui_strings() -> dict[str, Any]:
    """The panel's words (the builder hands them to the bundle with its own)."""
    return {
        "title": _("Testar"), "help": _("Converse com o fluxo como se fosse o paciente. Nada é enviado a ninguém "
                                        "e nada fica gravado."),
        "draft": _("Rascunho"), "published": _("Publicado"), "placeholder": _("Escreva como o paciente…"),
        "send": _("Enviar"), "silent": _("Não responder"), "restart": _("Recomeçar"),
        "understood": _("Entendido"), "exit": _("saída"), "nothing_understood": _("nada reconhecido"),
        "unwritten": _("(a mensagem não pôde ser escrita com este modelo)"),
        "waiting": _("O fluxo espera a resposta do paciente."), "running": _("Testando…"),
        "ended": _("Fim do fluxo: %(resultado)s"), "stopped": _("O fluxo parou: %(motivo)s"),
        "open": _("Testar"), "close": _("Fechar o teste"),
        "outcomes": {"converted": _("Convertido"), "exhausted": _("Esgotado (sem sucesso)"), "custom": _("Outro"),
                     "opted_out": _("O paciente não quer mais mensagens"), "replied": _("O paciente respondeu")},
        "intents": {"other": _("outra coisa"), "opt_out": _("não quer mais mensagens"), "choice": _("uma opção"),
                    "greeting": _("um cumprimento")},
    }


def read_body(body: Mapping[str, Any]) -> tuple[str, Any]:
    """The version and replies of the request; RehearsalRefused for anything else in it."""
    if set(body) - BODY_KEYS:
        raise RehearsalRefused("rehearsal_bad_replies")
    return body.get("version", "draft"), body.get("replies", [])


def answer(conn_for_words: Any, oid: int, pk: int, body: Mapping[str, Any], words: Mapping[str, Any]) -> dict[str, Any]:
    """Replay the conversation and answer its transcript in the reader's words. `words` are the
    builder's strings (exits, node types, intents); `conn_for_words` reads the org's field labels
    and the flow's node labels, after the rehearsal (which has its own, rolled-back, transaction)."""
    version, replies = read_body(body)
    transcript = rehearse(runtime(), oid, pk, version=version, replies=replies)
    return transcript_out(conn_for_words, oid, pk, transcript, words)


def transcript_out(conn: Connection, oid: int, pk: int, transcript: Transcript,
                   words: Mapping[str, Any]) -> dict[str, Any]:
    """The transcript as the panel draws it: each turn with its words filled in."""
    pointer = versions.get_flow(conn, oid, pk)
    try:
        graph = GraphIndex(pointer.draft_graph or {})
    except (KeyError, TypeError, ValueError):  # a draft the engine would refuse: steps go by their ids
        graph = GraphIndex({})
    panel = ui_strings()
    out = transcript.as_json()
    for turn, item in zip(transcript.turns, out["turns"]):
        item["node_label"] = _node_label(graph, turn.node, words)
        if turn.role == "bot":
            continue
        item["understood"] = _understood(conn, oid, turn, words, panel, graph)
        item["exit_label"] = _exit_label(turn.exit, graph, turn.node, words)
        item["next_label"] = _node_label(graph, turn.next_node, words)
        item["reason_text"] = _sentence(turn.reason)
        item["path"] = [{**step, "node_label": _node_label(graph, step["node"], words),
                         "exit_label": _exit_label(step["exit"], graph, step["node"], words),
                         "next_label": _node_label(graph, step["next"], words)} for step in turn.path]
    out["node_label"] = _node_label(graph, transcript.node, words)
    out["outcome_label"] = str(panel["outcomes"].get(transcript.outcome or "", transcript.outcome or ""))
    out["reason_text"] = _sentence(transcript.reason)
    return out


def _sentence(code: str | None) -> str | None:
    text = queries.sentence(code)
    return translate(text) if text is not None else None


def _node_label(graph: GraphIndex, node_id: str | None, words: Mapping[str, Any]) -> str | None:
    """A step as the canvas names it: its label, else its type's name (the draft's graph; a node
    only the published version has is named by its id)."""
    if node_id is None:
        return None
    try:
        node = graph.node(node_id)
    except KeyError:
        return node_id
    label = node.get("label")
    if label:
        return str(label)
    kind = words.get("node_types", {}).get(node.get("type"), {})
    return str(kind.get("name", node_id))


def _exit_label(condition: Mapping[str, Any] | None, graph: GraphIndex, node_id: str | None,
                words: Mapping[str, Any]) -> str | None:
    """An exit in the canvas's words: Completo, Sim, Sem resposta, the class's name…"""
    return exit_label(condition, graph, node_id, words.get("edges", {}))


def _understood(conn: Connection, oid: int, turn: Any, words: Mapping[str, Any],
                panel: Mapping[str, Any], graph: GraphIndex) -> list[str]:
    """What the reply was read as: the intent or class (by its name), then each field taken, in words."""
    out: list[str] = []
    if turn.label:
        out.append(str(class_label(graph, turn.node, turn.label)))
    elif turn.intent and not (turn.intent == "other" and turn.fields):  # a pick or a value says enough
        intents = {**panel["intents"], **words.get("choices", {}).get("intent", {})}
        out.append(str(intents.get(turn.intent, turn.intent)))
    fields = dict(turn.fields or {})
    slot = fields.pop("slot", None)  # the picked time last, after the fields
    if slot is not None:
        fields["slot"] = slot
    for label, shown in collected(conn, oid, SimpleNamespace(data=fields)):
        out.append(f"{label}={shown}")
    return out

