"""The public opt-out page behind email `List-Unsubscribe` links: no login, a signed token, and
RFC 8058 one-click (a POST with `List-Unsubscribe=One-Click` from the mail client)."""

from __future__ import annotations

from flask import Blueprint, abort, current_app, render_template, request
from sqlalchemy import select

from engine.people.contacts import opt_out
from engine.store.models import contacts, orgs
from engine.messaging.optout_links import read_token
from engine.store.runtime import Runtime

bp = Blueprint("optout", __name__)


@bp.route("/optout/<token>", methods=["GET", "POST"])
def optout(token: str):  # type: ignore[no-untyped-def]
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    target = read_token(rt.keyring, token)
    if target is None:
        abort(404)
    with rt.db.begin() as conn:
        org = conn.execute(select(orgs.c.name).where(orgs.c.id == target.org_id)).first()
        contact = conn.execute(select(contacts.c.id).where(contacts.c.org_id == target.org_id,
                                                           contacts.c.id == target.contact_id)).first()
        if org is None or contact is None:
            abort(404)
        if request.method == "POST":
            source = "list-unsubscribe" if request.form.get("List-Unsubscribe") == "One-Click" else "optout-page"
            opt_out(conn, target.org_id, target.contact_id, kinds=(target.kind,), source=source,
                    evidence=f"signed link ({request.method})")
            return render_template("optout.html", org_name=org.name, done=True, token=token)
    return render_template("optout.html", org_name=org.name, done=False, token=token)
