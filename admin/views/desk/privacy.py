"""The contacts view's privacy side (LGPD): erase a contact (owners only, after a confirmation
page), record a patient's opt-out told to the clinic, download a contact's consent evidence, and
show on the details page the refusals of its phone or e-mail and the other contacts on the same
phone (a dedupe hint).

`ContactPrivacyMixin` goes first in the contacts view's bases:
`class ContactView(ContactPrivacyMixin, TenantModelView)`."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from flask import abort, flash, make_response, redirect, request
from flask_admin import expose
from flask_login import current_user
from markupsafe import Markup
from sqlalchemy import and_, or_, select

from admin.i18n import _, _l, ngettext
from admin.views.base import KIND_LABELS, is_editor, local_dt, org_id, runtime, write_audit
from engine.people.contacts import opt_out
from engine.store.models import CHANNEL_KINDS, address_optouts, contacts
from engine.privacy import consent, erasure
from engine.queue import address_optouts as addresses

ADDRESS_LABELS = {"phone": _l("Telefone"), "email": _l("E-mail")}


def is_owner() -> bool:
    return bool(current_user.is_authenticated and current_user.role == "owner")


def _address_refusals(view: Any, model: Any) -> Markup:
    """Per address of the contact: the kinds refused for it (by this contact or another one)."""
    found = addresses.addresses_of(model.phone, model.email)
    if not found:
        return Markup("—")
    conn = view.session.connection()
    rows = conn.execute(select(address_optouts.c.address_kind, address_optouts.c.channel_kind,
                               address_optouts.c.created_at).where(
        address_optouts.c.org_id == org_id(),
        or_(*(and_(address_optouts.c.address_kind == k, address_optouts.c.value == v) for k, v in found)))).all()
    if not rows:
        return Markup('<span class="text-muted">{}</span>').format(_("nenhuma recusa"))
    by_address: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_address[row.address_kind].append(row)
    parts = []
    for kind, items in sorted(by_address.items()):
        channels = ", ".join(str(KIND_LABELS.get(k, k)) for k in CHANNEL_KINDS if k in {i.channel_kind for i in items})
        parts.append(Markup('<li><span class="badge badge-danger">{}</span> {}</li>').format(
            ADDRESS_LABELS.get(kind, kind),
            _("recusou %(canais)s em %(quando)s", canais=channels, quando=local_dt(min(i.created_at for i in items)))))
    return Markup("<ul class='mb-0 list-unstyled'>{}</ul>").format(Markup("").join(parts))


def _shared_phone(view: Any, model: Any) -> Markup:
    """Links to the other contacts with the same phone."""
    conn = view.session.connection()
    ids = addresses.sharing_phone(conn, org_id(), model.id)
    if not ids:
        return Markup("—")
    names = dict(conn.execute(select(contacts.c.id, contacts.c.name).where(
        contacts.c.org_id == org_id(), contacts.c.id.in_(ids))).all())
    links = [Markup('<a href="{}">{}</a>').format(view.get_url(".details_view", id=cid), names.get(cid) or f"#{cid}")
             for cid in ids]
    return Markup(", ").join(links)


class ContactPrivacyMixin:
    """Adds the privacy actions and details to a contacts view (see the module doc)."""

    details_template = "admin/contact_details.html"
    privacy_details = ("address_refusals", "shared_phone")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        details = tuple(getattr(cls, "column_details_list", None) or ())
        self.column_details_list = details + tuple(c for c in self.privacy_details if c not in details)
        self.column_formatters_detail = {**(getattr(cls, "column_formatters_detail", None) or {}),
                                         "address_refusals": lambda v, c, m, n: _address_refusals(v, m),
                                         "shared_phone": lambda v, c, m, n: _shared_phone(v, m)}
        self.column_labels = {**(getattr(cls, "column_labels", None) or {}),
                              "address_refusals": _l("Recusas do telefone ou e-mail"),
                              "shared_phone": _l("Outros contatos com este telefone")}
        super().__init__(*args, **kwargs)

    @expose("/erase/<int:id>/", methods=("GET", "POST"))
    def erase_view(self, id: int) -> Any:
        """Owners only: a page that says what erasing does, then the erasure."""
        if not is_owner():
            abort(403)
        model = self.get_one(id)  # type: ignore[attr-defined]  # another org's or an erased contact: 404
        conn = self.session.connection()  # type: ignore[attr-defined]
        if request.method == "POST":
            if request.form.get("confirm") != "yes":
                flash(_("Marque a confirmação para apagar o paciente."), "error")
            else:
                done = erasure.erase_contact(conn, org_id(), model.id, by=f"user:{int(current_user.id)}",
                                             keyring=runtime().keyring)
                write_audit(conn, "erase", "contacts", model.id, done.counts())
                self.session.commit()  # type: ignore[attr-defined]
                flash(_("Paciente apagado: %(mensagens)s, %(canceladas)s, %(fluxos)s.",
                        mensagens=ngettext("%(num)d mensagem anonimizada", "%(num)d mensagens anonimizadas",
                                           done.messages_anonymised),
                        canceladas=ngettext("%(num)d cancelada antes do envio", "%(num)d canceladas antes do envio",
                                            done.messages_cancelled),
                        fluxos=ngettext("%(num)d acompanhamento encerrado", "%(num)d acompanhamentos encerrados",
                                        done.enrollments_ended)), "success")
                return redirect(self.get_url(".index_view"))  # type: ignore[attr-defined]
        plan = erasure.preview(conn, org_id(), model.id)
        self.session.rollback()  # type: ignore[attr-defined]
        return self.render("admin/contact_erase.html", model=model, plan=plan,  # type: ignore[attr-defined]
                           return_url=self.get_url(".details_view", id=model.id))  # type: ignore[attr-defined]

    @expose("/optout/<int:id>/", methods=("POST",))
    def optout_view(self, id: int) -> Any:
        """The patient told the clinic to stop: every kind refused, for the contact and its addresses."""
        if not is_editor():
            abort(403)
        model = self.get_one(id)  # type: ignore[attr-defined]
        conn = self.session.connection()  # type: ignore[attr-defined]
        cancelled = opt_out(conn, org_id(), model.id, source="console", evidence=f"user:{int(current_user.id)}")
        write_audit(conn, "opt_out", "contacts", model.id, {"kinds": list(CHANNEL_KINDS), "cancelled": len(cancelled)})
        self.session.commit()  # type: ignore[attr-defined]
        flash(_("Descadastro registrado: nada mais é enviado a este paciente nem ao telefone e e-mail dele."),
              "success")
        return redirect(self.get_url(".details_view", id=model.id))  # type: ignore[attr-defined]

    @expose("/consent/<int:id>/")
    def consent_view(self, id: int) -> Any:
        """The contact's consent evidence as a JSON download."""
        model = self.get_one(id)  # type: ignore[attr-defined]
        document = consent.evidence(self.session.connection(), org_id(), model.id)  # type: ignore[attr-defined]
        self.session.rollback()  # type: ignore[attr-defined]
        response = make_response(json.dumps(document, ensure_ascii=False, indent=2))
        response.headers["Content-Type"] = "application/json; charset=utf-8"
        response.headers["Content-Disposition"] = f'attachment; filename="consentimento-{model.id}.json"'
        response.headers["Cache-Control"] = "no-store"
        return response

    def render(self, template: str, **kwargs: Any) -> Any:
        kwargs.setdefault("lembra_is_owner", is_owner())
        kwargs.setdefault("lembra_is_editor", is_editor())
        return super().render(template, **kwargs)  # type: ignore[misc]
