"""Sign-in for the console: Flask-Login over the `users` table, hashed passwords, CSRF."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

from flask import (
    Blueprint,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_login import LoginManager, UserMixin, current_user, login_required, login_user, logout_user
from flask_wtf import FlaskForm
from sqlalchemy import select, update
from werkzeug.exceptions import HTTPException
from wtforms import EmailField, PasswordField
from wtforms.validators import DataRequired

from admin.i18n import LOCALES, _, _l, ngettext
from admin.throttle import LoginThrottle
from engine.core import clock
from engine.store.models import orgs, users
from engine.tenants.orgs import end_sessions, verify_password
from engine.store.runtime import Runtime

bp = Blueprint("auth", __name__)
login_manager = LoginManager()
login_manager.login_view = "auth.login"
login_manager.login_message = _l("Entre para continuar.")


class SessionUser(UserMixin):
    """The signed-in user: id, org and role (never the hash)."""

    def __init__(self, row: Any) -> None:
        self.id = str(row.id)
        self.org_id = int(row.org_id)
        self.email = row.email
        self.role = row.role
        self.generation = int(row.session_generation or 0)
        # The console's language: the user's own choice, else the org's.
        self.locale = row.locale or row.org_locale

    def get_id(self) -> str:
        """What Flask-Login keeps in the signed session: the user and the session generation it was
        issued under ("12:3"). Signing out, a password change or a deactivation bumps the user's
        generation (engine.tenants.orgs.end_sessions), and a session of an older one no longer loads."""
        return f"{self.id}:{self.generation}"

    @property
    def can_edit(self) -> bool:
        return self.role in ("owner", "manager")


@login_manager.user_loader
def load_user(session_id: str) -> SessionUser | None:
    """The user of a session, checked on every request: active, and of the current generation
    (sessions from before this scheme, a bare id, load nobody: those users sign in again)."""
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    user_id, sep, generation = session_id.partition(":")
    if not (sep and user_id.isdigit() and generation.isdigit()):
        return None
    with rt.db.connect() as conn:
        row = conn.execute(
            select(users, orgs.c.locale.label("org_locale")).join(orgs, orgs.c.id == users.c.org_id)
            .where(users.c.id == int(user_id), users.c.active.is_(True),
                   users.c.session_generation == int(generation))).first()
    return SessionUser(row) if row else None


def sign_in_again(user_id: int) -> None:
    """Re-issue this browser's session under the user's current generation (after they changed
    their own password: the other sessions end, this one goes on)."""
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    with rt.db.connect() as conn:
        row = conn.execute(
            select(users, orgs.c.locale.label("org_locale")).join(orgs, orgs.c.id == users.c.org_id)
            .where(users.c.id == user_id, users.c.active.is_(True))).first()
    if row is not None:
        login_user(SessionUser(row))


class LoginForm(FlaskForm):
    email = EmailField(_l("E-mail"), validators=[DataRequired()])
    password = PasswordField(_l("Senha"), validators=[DataRequired()])


@bp.route("/login", methods=["GET", "POST"])
def login():  # type: ignore[no-untyped-def]
    form = LoginForm()
    if form.validate_on_submit():
        rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
        throttle: LoginThrottle = current_app.extensions["lembra_login_throttle"]
        email = form.email.data.strip().lower()
        address = request.remote_addr or ""
        wait = throttle.retry_after(email, address)
        if wait:
            # Checked before the password, so a blocked guesser learns nothing from the answer.
            minutes = max(1, -(-wait // 60))
            flash(ngettext("Muitas tentativas. Tente de novo em %(num)d minuto.",
                           "Muitas tentativas. Tente de novo em %(num)d minutos.", minutes), "error")
            return render_template("login.html", form=form), 429, {"Retry-After": str(wait)}
        with rt.db.begin() as conn:
            row = conn.execute(
                select(users, orgs.c.locale.label("org_locale")).join(orgs, orgs.c.id == users.c.org_id)
                .where(users.c.email == email, users.c.active.is_(True))
            ).first()
            # An unknown (or inactive) e-mail is checked against a dummy hash of the same cost:
            # the answer takes as long as for a wrong password, so its time names no account.
            if verify_password(row.password_hash if row is not None else None, form.password.data) \
                    and row is not None:
                conn.execute(update(users).where(users.c.id == row.id).values(last_login_at=clock.now()))
                throttle.succeeded(email)
                login_user(SessionUser(row))
                return redirect(safe_next(request.args.get("next")) or url_for("admin.index"))
        throttle.failed(email, address)
        flash(_("E-mail ou senha incorretos."), "error")
    return render_template("login.html", form=form)


#: What a browser drops from a URL (tab, newline …) or reads as "/" (backslash), and spaces: none of
#: them is in a path this app makes, and any of them can turn "/\t/evil.example" into "//evil.example".
_UNSAFE_IN_URL = re.compile(r"[\x00-\x20\x7f\\]")
_UNSAFE_IN_PATH = re.compile(r"[\x00-\x1f\x7f\\]")


def safe_next(target: str | None) -> str | None:
    """Where to go after signing in (or changing language): `target` when it is a page of this
    app, as a relative path and query, else None.

    Refused: any scheme or host (`https:evil`, `javascript:`, `//evil`), anything a browser would
    clean up into one (tab, newline, backslash), the same once percent-decoded (`/%2F%2Fevil`,
    `/%5Cevil`), and a path that no GET route of the app matches (`app.url_map`)."""
    if not target or _UNSAFE_IN_URL.search(target):
        return None
    parts = urlsplit(target)
    path = unquote(parts.path)
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or parts.path.startswith("//") \
            or path.startswith("//") or _UNSAFE_IN_PATH.search(path):
        return None
    try:
        current_app.url_map.bind_to_environ(request.environ).match(path, method="GET")
    except HTTPException:  # no such page, not a GET page, or only its redirect (`/admin` → `/admin/`)
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


@bp.route("/logout", methods=["POST"])
@login_required
def logout():  # type: ignore[no-untyped-def]
    """Sign out, everywhere: the user's session generation moves on, so a copy of this cookie
    (or any other browser's) stops working too."""
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    with rt.db.begin() as conn:
        end_sessions(conn, int(current_user.id))
    logout_user()
    return redirect(url_for("auth.login"))


@bp.route("/account/locale", methods=["POST"])
@login_required
def set_locale():  # type: ignore[no-untyped-def]
    """The signed-in user's console language (kept on the user, so it follows them)."""
    locale = request.form.get("locale", "")
    if locale not in LOCALES:
        abort(400)
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    with rt.db.begin() as conn:
        conn.execute(update(users).where(users.c.id == int(current_user.id), users.c.org_id == current_user.org_id)
                     .values(locale=locale))
    return redirect(safe_next(request.form.get("next")) or url_for("admin.index"))
