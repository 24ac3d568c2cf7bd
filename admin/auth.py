"""Sign-in for the console: Flask-Login over the `users` table, hashed passwords, CSRF."""

from __future__ import annotations

from typing import Any

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
from werkzeug.security import check_password_hash
from wtforms import EmailField, PasswordField
from wtforms.validators import DataRequired

from admin.i18n import LOCALES, _, _l, ngettext
from admin.throttle import LoginThrottle
from engine import clock
from engine.models import orgs, users
from engine.runtime import Runtime

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
        # The console's language: the user's own choice, else the org's.
        self.locale = row.locale or row.org_locale

    @property
    def can_edit(self) -> bool:
        return self.role in ("owner", "manager")


@login_manager.user_loader
def load_user(user_id: str) -> SessionUser | None:
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    if not user_id.isdigit():
        return None
    with rt.db.connect() as conn:
        row = conn.execute(
            select(users, orgs.c.locale.label("org_locale")).join(orgs, orgs.c.id == users.c.org_id)
            .where(users.c.id == int(user_id), users.c.active.is_(True))).first()
    return SessionUser(row) if row else None


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
            if row is not None and check_password_hash(row.password_hash, form.password.data):
                conn.execute(update(users).where(users.c.id == row.id).values(last_login_at=clock.now()))
                throttle.succeeded(email)
                login_user(SessionUser(row))
                target = request.args.get("next")
                return redirect(target if _safe_next(target) else url_for("admin.index"))
        throttle.failed(email, address)
        flash(_("E-mail ou senha incorretos."), "error")
    return render_template("login.html", form=form)


def _safe_next(target: str | None) -> bool:
    return bool(target) and target.startswith("/") and not target.startswith("//")


@bp.route("/logout", methods=["POST"])
@login_required
def logout():  # type: ignore[no-untyped-def]
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
    target = request.form.get("next")
    return redirect(target if _safe_next(target) else url_for("admin.index"))
