"""Atendimento: the org's conversation settings that were the CLI's only (`lembra orgs transcription`,
`lembra orgs staff-quiet`): the transcription server for patients' voice notes, how long the robot
stays quiet after the clinic answers from its own phone, and the reply debounce.

Each value is saved through the engine's own setter, the one the CLI uses: the transcription URL
passes the egress guard there (`engine.messaging.voice.configure_transcription`), the minutes and
seconds their bounds (`clinic_phone.set_quiet_minutes`, `replies.set_reply_debounce`). A refusal is
the catalogue's sentence on its input and nothing is written (one transaction for the whole form).

The API key is write-only: the page only says whether one is stored ("guardada"); an empty key
field keeps it while the URL points to the same server, another server drops it (it is never sent
where it was not typed for). The audit row names what changed, never the key nor the URL (which
may hold a token). Owners and managers only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import flash, redirect, request, url_for
from flask_admin import expose
from sqlalchemy import select

from admin.i18n import _, translate
from admin.views.base import db_session, org_id, runtime, write_audit
from admin.views.settings.gated import AdminPageView
from engine.core.errors import SettingRefused
from engine.flows.replies import MAX_REPLY_DEBOUNCE_SECONDS, set_reply_debounce
from engine.messaging.clinic_phone import MAX_QUIET_MINUTES, set_quiet_minutes
from engine.messaging.voice import configure_transcription
from engine.store.models import orgs
from engine.words.catalogue import describe

#: The form's inputs, by the setting each one changes.
INPUTS = {"transcription_base_url": "url", "transcription_model": "model", "transcription_api_key": "api_key",
          "staff_quiet_minutes": "quiet_minutes", "reply_debounce_seconds": "debounce_seconds"}


def _number(raw: str | None) -> Any:
    """A whole number from the form, or the text as typed (the engine's setter refuses it)."""
    text = (raw or "").strip()
    return int(text) if text.isdigit() and len(text) <= 6 else text


def _refusal(exc: SettingRefused) -> tuple[str, str]:
    """(the input, the catalogue's sentence) of an engine refusal."""
    return INPUTS.get(exc.field, "url"), translate(describe(exc.code, **exc.params))


class ConversationSettingsView(AdminPageView):
    """Atendimento (endpoint `settings_conversation`, /admin/settings/conversation/)."""

    @expose("/", methods=("GET", "POST"))
    def index(self) -> Any:
        """The settings; a POST saves the whole form or shows what to fix, writing nothing."""
        session = db_session()
        conn = session.connection()
        oid = org_id()
        org = conn.execute(select(orgs).where(orgs.c.id == oid)).one()
        errors: dict[str, str] = {}
        if request.method == "POST":
            form = request.form
            values = {"url": (form.get("url") or "").strip(), "model": (form.get("model") or "").strip(),
                      "quiet_minutes": (form.get("quiet_minutes") or "").strip(),
                      "debounce_seconds": (form.get("debounce_seconds") or "").strip()}
            errors, changed, dropped = self._save(conn, org, values, form.get("api_key") or "")
            if errors:
                session.rollback()
            else:
                if changed:  # the new values; for the server and the key only whether there is one
                    write_audit(conn, "update", "orgs", oid, changed)
                session.commit()
                if dropped:
                    flash(translate(describe("credentials_cleared_new_endpoint")), "warning")
                flash(_("Configurações de atendimento salvas."), "success")
                return redirect(url_for(".index"))
        else:
            session.rollback()
            values = {"url": org.transcription_base_url or "", "model": org.transcription_model or "",
                      "quiet_minutes": str(org.staff_quiet_minutes),
                      "debounce_seconds": str(org.reply_debounce_seconds)}
        return self.render("admin/settings/conversation.html", values=values, errors=errors,
                           key_stored=org.transcription_api_key is not None,
                           server_set=bool(org.transcription_base_url),
                           max_quiet=MAX_QUIET_MINUTES, max_debounce=MAX_REPLY_DEBOUNCE_SECONDS)

    def _save(self, conn: Any, org: Any, values: Mapping[str, str],
              api_key: str) -> tuple[dict[str, str], dict[str, Any], bool]:
        """Every setting through its engine setter, in this transaction: (errors by input, the
        audit's changes, whether a stored key was dropped). The caller rolls back on errors.
        The URL is audited as whether there is a server (it may hold a token), the key likewise."""
        errors: dict[str, str] = {}
        changed: dict[str, Any] = {}
        dropped = False
        api_key = api_key.strip()
        url, model = values["url"], values["model"]
        if not url and (api_key or model):
            errors["url"] = translate(describe("url_invalid"))  # a key or model for no server
        elif (url != (org.transcription_base_url or "") or model != (org.transcription_model or "")
              or api_key):
            try:
                dropped = configure_transcription(conn, runtime().keyring, org.id, base_url=url or None,
                                                  model=model or None, api_key=api_key or None, keep_key=True,
                                                  egress=runtime().settings.egress)
            except SettingRefused as exc:
                where, text = _refusal(exc)
                errors[where] = text
            else:
                if url != (org.transcription_base_url or ""):
                    changed["transcription_server"] = bool(url)
                if model != (org.transcription_model or ""):
                    changed["model"] = model
                if api_key or dropped or (not url and org.transcription_api_key is not None):
                    changed["api_key_set"] = bool(api_key)
        for name, setter, raw, old in (
                ("staff_quiet_minutes", set_quiet_minutes, values["quiet_minutes"], org.staff_quiet_minutes),
                ("reply_debounce_seconds", set_reply_debounce, values["debounce_seconds"],
                 org.reply_debounce_seconds)):
            number = _number(raw)
            if number == old:
                continue
            try:
                setter(conn, org.id, number)
            except SettingRefused as exc:
                where, text = _refusal(exc)
                errors[where] = text
            else:
                changed[name] = number
        return errors, changed, dropped

    @expose("/clear/", methods=("POST",))
    def clear(self) -> Any:
        """"Remover o servidor": no transcription server, model or key (voice notes go to a person)."""
        session = db_session()
        conn = session.connection()
        oid = org_id()
        had = conn.execute(select(orgs.c.transcription_base_url).where(orgs.c.id == oid)).scalar()
        configure_transcription(conn, runtime().keyring, oid, base_url=None, model=None)
        if had:
            write_audit(conn, "update", "orgs", oid, {"transcription_server": False, "model": "",
                                                      "api_key_set": False})
        session.commit()
        flash(_("Servidor de transcrição removido: os áudios dos pacientes vão para uma pessoa."), "success")
        return redirect(url_for(".index"))
