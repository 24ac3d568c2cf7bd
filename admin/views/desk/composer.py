"""Writing first to a patient from the contact's page ("Escrever ao paciente").

The same rules and the same outbox as answering in Conversas (engine/messaging/conversations.py
`send_to_contact`): on the channel kind the patient last wrote on (else the first the clinic has
and the patient has an address for); free text inside Meta's 24 h customer-service window, the
approved template outside it (the page says why in a sentence); nothing to a patient who refused
messages or never consented (the composer says so and the POST refuses). Every role writes: the
front desk talks to patients. The contact is the org's (`get_one`: another org's id is a 404)
and the app's CSRFProtect refuses any POST without the session's token. "Assumir a conversa"
lands here (#lembra-compose).
"""

from __future__ import annotations

import uuid
from typing import Any

from flask import abort, flash, redirect, request
from flask_admin import expose
from flask_login import current_user

from admin.i18n import translate
from admin.views.base import KIND_LABELS, org_id, write_audit
from engine.messaging import conversations as convs
from engine.words.catalogue import describe

#: The audit log's entity for a message a person wrote first (an answer is `inbound_messages`).
AUDIT_ENTITY = "contacts"


def composer_context(conn: Any, oid: int, contact_id: int) -> dict[str, Any]:
    """What the contact page's composer shows: the channel, what may go now and, when free text
    may not, the sentence saying why."""
    kind = convs.compose_kind(conn, oid, contact_id)
    options = convs.contact_options(conn, oid, contact_id, kind)
    return {"kind": kind, "kind_label": KIND_LABELS.get(kind, kind) if kind else None, "options": options,
            "reason": translate(describe(options.reason)) if options.reason else None,
            "form_key": uuid.uuid4().hex, "max_reply": convs.MAX_REPLY}


class ComposerMixin:
    """The composer on the contacts view's details page, and the endpoint it posts to."""

    def render(self, template: str, **kwargs: Any) -> Any:
        model = kwargs.get("model")
        if template == getattr(self, "details_template", None) and model is not None:
            kwargs.setdefault("composer_", composer_context(self.session.connection(),  # type: ignore[attr-defined]
                                                           org_id(), int(model.id)))
        return super().render(template, **kwargs)  # type: ignore[misc]

    @expose("/compose/<int:id>/", methods=("POST",))
    def compose_view(self, id: int) -> Any:
        """Queue what the person wrote (or, with `template=1`, the approved template) for the patient."""
        model = self.get_one(id)  # type: ignore[attr-defined]  # another org's (or an erased) contact: 404
        key = request.form.get("key", "")
        if not convs.FORM_KEY.match(key):
            abort(400)  # the page always sends one; anything else is not our form
        use_template = request.form.get("template") == "1"
        conn = self.session.connection()  # type: ignore[attr-defined]
        result = convs.send_to_contact(conn, org_id(), int(model.id), int(current_user.id), key,
                                       text=request.form.get("text"), use_template=use_template)
        if result.message_id is not None:
            write_audit(conn, "write", AUDIT_ENTITY, int(model.id), {"message_id": result.message_id,
                                                                     "template": use_template})
        self.session.commit()  # type: ignore[attr-defined]
        params = {"max": convs.MAX_REPLY} if result.code == "conversation_text_too_long" else {}
        category = "success" if result.message_id is not None else \
            "info" if result.code == "conversation_already_sent" else "error"
        flash(translate(describe(result.code, **params)), category)
        return redirect(self.get_url(".details_view", id=model.id) + "#lembra-compose")  # type: ignore[attr-defined]
