"""Sign-in for the console: Flask-Login over the `users` table, hashed passwords, CSRF."""

from __future__ import annotations

from typing import Any

from flask import (
    Blueprint,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_login import LoginManager, UserMixin, login_required, login_user, logout_user
from flask_wtf import FlaskForm
from sqlalchemy import select, update
from werkzeug.security import check_password_hash
from wtforms import EmailField, PasswordField
from wtforms.validators import DataRequired

from engine import clock
from engine.models import users
from engine.runtime import Runtime

bp = Blueprint("auth", __name__)
login_manager = LoginManager()
login_manager.login_view = "auth.login"
login_manager.login_message = "Entre para continuar."


class SessionUser(UserMixin):
    """The signed-in user: id, org and role (never the hash)."""

    def __init__(self, row: Any) -> None:
        self.id = str(row.id)
        self.org_id = int(row.org_id)
        self.email = row.email
        self.role = row.role

    @property
    def can_edit(self) -> bool:
        return self.role in ("owner", "manager")


@login_manager.user_loader
def load_user(user_id: str) -> SessionUser | None:
    rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
    if not user_id.isdigit():
        return None
    with rt.db.connect() as conn:
        row = conn.execute(select(users).where(users.c.id == int(user_id), users.c.active.is_(True))).first()
    return SessionUser(row) if row else None


class LoginForm(FlaskForm):
    email = EmailField("E-mail", validators=[DataRequired()])
    password = PasswordField("Senha", validators=[DataRequired()])


@bp.route("/login", methods=["GET", "POST"])
def login():  # type: ignore[no-untyped-def]
    form = LoginForm()
    if form.validate_on_submit():
        rt: Runtime = current_app.config["LEMBRA_RUNTIME"]
        with rt.db.begin() as conn:
            row = conn.execute(
                select(users).where(users.c.email == form.email.data.strip().lower(), users.c.active.is_(True))
            ).first()
            if row is not None and check_password_hash(row.password_hash, form.password.data):
                conn.execute(update(users).where(users.c.id == row.id).values(last_login_at=clock.now()))
                login_user(SessionUser(row))
                return redirect(request.args.get("next") if _safe_next(request.args.get("next")) else url_for("console.sandbox"))
        flash("E-mail ou senha incorretos.", "error")
    return render_template("login.html", form=form)


def _safe_next(target: str | None) -> bool:
    return bool(target) and target.startswith("/") and not target.startswith("//")


@bp.route("/logout", methods=["POST"])
@login_required
def logout():  # type: ignore[no-untyped-def]
    logout_user()
    return redirect(url_for("auth.login"))
