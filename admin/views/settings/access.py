"""Chaves de API and Usuários: who (software or person) may act for the org.

Both views inherit the tenant-scoped base and narrow it further by role: API keys are for
owners and managers, users for owners only. Anyone else signed in gets 403 (not a redirect to
the login page: they are signed in, they just may not be here), and the menu hides the entry.
"""

from __future__ import annotations

import re
from typing import Any

from flask import abort, flash, g, make_response, redirect, url_for
from flask_admin import expose
from flask_admin.actions import action
from flask_login import current_user
from markupsafe import Markup
from wtforms import BooleanField, EmailField, PasswordField, SelectField, StringField
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, Length, Optional, Regexp

from admin.auth import sign_in_again
from admin.i18n import _, _l, ngettext
from admin.views.base import TenantModelView, db_session, ids_of, org_id, write_audit
from engine.tenants.apikeys import KEY_PREFIX, NewApiKey, create_key, revoke
from engine.core.errors import DomainError
from engine.store.models import ApiKey, Org, User
from engine.tenants.orgs import ROLES, EmailTaken, create_user, hash_password

#: The console asks for more than the domain's floor (8, which the CLI and the demo keep using):
#: these accounts can read patients' appointments and change what is sent to them.
MIN_PASSWORD_LENGTH = 12
#: Same shape the domain accepts (engine.tenants.orgs.create_user), checked here for a message on the field.
EMAIL_PATTERN = re.compile(r"^\s*[^@\s]+@[^@\s]+\.[^@\s]+\s*$")

#: The one answer to an e-mail the domain refuses, a taken one included (in this org or another).
EMAIL_REFUSED = _l("Não foi possível usar este e-mail. Confira o endereço ou use outro.")

ROLE_LABELS = {"owner": _l("proprietário"), "manager": _l("gestor"), "agent": _l("atendente")}


def role_choices() -> list[SelectChoice]:
    """The roles as select options, labelled in the user's language."""
    return [SelectChoice(role, ROLE_LABELS[role]) for role in ROLES]


class RoleGatedView(TenantModelView):
    """A tenant view only some roles may open at all (list, details, export, actions, forms)."""

    #: Roles that may open the view; everyone else signed in gets 403.
    allowed_roles: tuple[str, ...] = ()

    def is_accessible(self) -> bool:
        return super().is_accessible() and current_user.role in self.allowed_roles

    def inaccessible_callback(self, name: str, **kwargs: Any) -> Any:
        if current_user.is_authenticated:
            abort(403)
        return super().inaccessible_callback(name, **kwargs)


# --- API keys ------------------------------------------------------------------------------------
def key_hint(model: Any) -> str:
    """What identifies a key without revealing it: its public prefix, e.g. `lembra_ab12cd34…`."""
    return f"{KEY_PREFIX}_{model.prefix}…"


def _key_status(view: Any, context: Any, model: Any, name: str) -> Markup:
    # Not base.badge: its labels are masculine ("Ativo"), a chave is feminine.
    if model.revoked_at is None:
        return Markup('<span class="badge badge-success">{}</span>').format(_("Ativa"))
    return Markup('<span class="badge badge-secondary">{}</span>').format(_("Revogada"))


class ApiKeyView(RoleGatedView):
    """The org's keys for /api/v1: create (the key is shown once), list, revoke. Never a hash."""

    allowed_roles = ("owner", "manager")
    allow_create = True
    allow_edit = False  # nothing to edit: a key is replaced, not changed
    allow_delete = False  # revoke instead: audit rows keep pointing at the key
    column_list = ("name", "prefix", "created_at", "last_used_at", "status")
    column_details_list = ("name", "prefix", "created_at", "last_used_at", "revoked_at", "status")
    column_export_list = column_details_list
    column_labels = {"name": _l("Nome"), "prefix": _l("Chave"), "created_at": _l("Criada em"),
                     "last_used_at": _l("Último uso"), "revoked_at": _l("Revogada em"), "status": _l("Situação")}
    column_formatters = {"prefix": lambda v, c, m, n: key_hint(m), "status": _key_status}
    column_formatters_detail = column_formatters
    column_formatters_export = {"prefix": lambda v, c, m, n: key_hint(m),
                                "status": lambda v, c, m, n: "active" if m.revoked_at is None else "revoked"}
    column_searchable_list = ("name",)
    column_sortable_list = ("name", "created_at", "last_used_at")
    column_default_sort = ("id", True)
    create_template = "admin/apikey_create.html"
    details_template = "admin/apikey_details.html"
    list_template = "admin/apikey_list.html"  # the org's slug above the keys (what --org and support ask for)
    empty_message = _l("Nenhuma chave de API. Crie uma para o sistema da clínica enviar contatos e agendamentos "
                       "ao Lembra.")
    audit_entity = "api_keys"

    def render(self, template: str, **kwargs: Any) -> Any:
        kwargs.setdefault("org", db_session().get(Org, org_id()))
        return super().render(template, **kwargs)

    def scaffold_form(self) -> Any:
        class ApiKeyForm(self.form_base_class):  # type: ignore[name-defined,misc]
            name = StringField(
                _l("Nome"), validators=[DataRequired(message=_l("Dê um nome à chave.")), Length(max=200)],
                description=_l("Para saber depois quem usa a chave, por exemplo “Agenda da recepção”."))
        return ApiKeyForm

    def create_model(self, form: Any) -> Any:
        conn = self.session.connection()
        try:
            new = create_key(conn, org_id=org_id(), name=form.name.data)  # hashes; the key is not stored
        except DomainError:
            self.session.rollback()
            form.name.errors = [*form.name.errors, _("Informe um nome de até 200 caracteres.")]
            return False
        write_audit(conn, "create", self.audit_entity, new.id, {"name": form.name.data.strip(), "prefix": new.prefix})
        self.session.commit()
        # Handed to create_view in this request's memory only: never a redirect URL, the session
        # cookie or a log line.
        g.lembra_new_api_key = new
        return self.get_one(new.id)

    @expose("/new/", methods=("GET", "POST"))
    def create_view(self) -> Any:
        """Flask-Admin's create form; after a save, the page that shows the whole key, once."""
        response = super().create_view()
        new: NewApiKey | None = g.pop("lembra_new_api_key", None)
        if new is None:
            return response
        page = make_response(self.render("admin/apikey_created.html", new_key=new.key, model=self.get_one(new.id),
                                         return_url=self.get_url(".index_view")))
        page.headers["Cache-Control"] = "no-store"  # no copy of the key in a browser or proxy cache
        return page

    def _revoke(self, ids: list[int]) -> int:
        conn = self.session.connection()
        names = dict(self.get_query().filter(ApiKey.id.in_(ids)).with_entities(ApiKey.id, ApiKey.name).all())
        done = 0
        for key_id in ids:
            if key_id in names and revoke(conn, org_id(), key_id):
                write_audit(conn, "revoke", self.audit_entity, key_id, {"name": names[key_id]})
                done += 1
        self.session.commit()
        return done

    def _flash_revoked(self, done: int) -> None:
        if done:
            flash(ngettext("%(num)d chave revogada: ela já não abre a API.",
                           "%(num)d chaves revogadas: elas já não abrem a API.", done), "success")
        else:
            flash(_("Nenhuma das chaves selecionadas estava ativa."), "warning")

    @action("revoke", _l("Revogar"), _l("Revogar as chaves selecionadas? Quem as usa perde o acesso à API na hora."))
    def action_revoke(self, ids: Any) -> None:
        """List action: revoke the selected keys of the org (other ids are ignored)."""
        self._flash_revoked(self._revoke(ids_of(ids)))

    @expose("/revoke/<int:id>/", methods=("POST",))
    def revoke_view(self, id: int) -> Any:
        """The details page's Revogar button."""
        model = self.get_one(id)  # another org's key: 404
        self._flash_revoked(self._revoke([int(model.id)]))
        return redirect(self.get_url(".details_view", id=id))


# --- users -----------------------------------------------------------------------------------------
def _email_field(**kwargs: Any) -> EmailField:
    return EmailField(_l("E-mail"), **kwargs)


class UserView(RoleGatedView):
    """The org's console users; owners only. The last active owner cannot be demoted or
    deactivated (the org would be left with nobody able to manage it)."""

    allowed_roles = ("owner",)
    allow_create = True
    allow_edit = True
    allow_delete = False  # deactivate instead: audit rows keep pointing at the user
    column_list = ("email", "role", "active", "last_login_at")
    column_details_list = ("email", "role", "active", "last_login_at", "created_at")
    column_export_list = column_list
    column_labels = {"email": _l("E-mail"), "role": _l("Papel"), "active": _l("Ativo"),
                     "last_login_at": _l("Último acesso"), "created_at": _l("Criado em")}
    column_formatters = {"role": lambda v, c, m, n: ROLE_LABELS.get(m.role, m.role)}
    column_formatters_detail = column_formatters
    column_formatters_export = {"role": lambda v, c, m, n: m.role}
    column_searchable_list = ("email",)
    column_sortable_list = ("email", "role", "last_login_at")
    column_default_sort = ("email", False)
    empty_message = _l("Nenhum usuário encontrado.")
    audit_entity = "users"

    def get_create_form(self) -> Any:
        class NewUserForm(self.form_base_class):  # type: ignore[name-defined,misc]
            email = _email_field(validators=[
                DataRequired(message=_l("Informe o e-mail.")), Length(max=254),
                Regexp(EMAIL_PATTERN, message=_l("Informe um e-mail válido."))])
            role = SelectField(_l("Papel"), choices=role_choices, default="agent",
                               description=_l("Proprietário gerencia usuários; gestor configura; atendente "
                                              "acompanha a fila e resolve pendências."))
            password = PasswordField(_l("Senha"), validators=[
                DataRequired(message=_l("Defina uma senha.")),
                Length(min=MIN_PASSWORD_LENGTH, max=200,
                       message=_l("A senha precisa ter de %(min)d a %(max)d caracteres."))],
                description=_l("Pelo menos 12 caracteres. Entregue-a à pessoa por um canal seguro."))
        return NewUserForm

    def get_edit_form(self) -> Any:
        class EditUserForm(self.form_base_class):  # type: ignore[name-defined,misc]
            # Shown for context only: the e-mail is the login and is not changed here.
            email = _email_field(render_kw={"readonly": True, "disabled": True})
            role = SelectField(_l("Papel"), choices=role_choices)
            active = BooleanField(_l("Ativo"), description=_l("Quem está inativo não entra mais no console."))
            new_password = PasswordField(_l("Nova senha"), validators=[
                Optional(), Length(min=MIN_PASSWORD_LENGTH, max=200,
                                   message=_l("A senha precisa ter de %(min)d a %(max)d caracteres."))],
                description=_l("Deixe em branco para manter a senha atual."))
        return EditUserForm

    def create_model(self, form: Any) -> Any:
        conn = self.session.connection()
        email = form.email.data.strip().lower()
        try:
            # The same function as `lembra users create`: one place validates and hashes.
            user_id = create_user(conn, org_id=org_id(), email=email, role=form.role.data,
                                  password=form.password.data)
        except EmailTaken:
            # E-mails are unique across every org (they are the login). Whose it is, and that it is
            # anyone's, is not this org's business: the same neutral refusal as any other e-mail.
            self.session.rollback()
            form.email.errors = [*form.email.errors, str(EMAIL_REFUSED)]
            return False
        except DomainError as exc:
            self.session.rollback()
            flash(_("Não foi possível salvar: %(erro)s", erro=str(exc)), "error")
            return False
        write_audit(conn, "create", self.audit_entity, user_id, {"email": email, "role": form.role.data})
        self.session.commit()
        return self.get_one(user_id)

    def _other_active_owners(self, model: Any) -> int:
        """Active owners of the org besides `model`. Every active owner row is locked (PostgreSQL)
        so that two owners demoting each other at once cannot both succeed."""
        rows = (self.get_query().filter(User.role == "owner", User.active.is_(True))
                .order_by(User.id).with_for_update().with_entities(User.id).all())
        return sum(1 for row in rows if row.id != model.id)

    def update_model(self, form: Any, model: Any) -> bool:
        role, active = form.role.data, bool(form.active.data)
        if role not in ROLES:  # the select already refuses it; this keeps a forged POST out too
            abort(400)
        loses_owner = model.role == "owner" and model.active and (role != "owner" or not active)
        if loses_owner and self._other_active_owners(model) == 0:
            self.session.rollback()
            flash(_("Não foi possível salvar: esta é a última pessoa proprietária ativa da clínica. "
                    "Torne outra pessoa proprietária antes de mudar o papel ou desativar esta."), "error")
            return False
        changes: dict[str, Any] = {}
        if model.role != role:
            model.role = changes["role"] = role
        if bool(model.active) != active:
            model.active = changes["active"] = active
        if form.new_password.data:
            model.password_hash = hash_password(form.new_password.data)
            changes["password_changed"] = True  # that it changed, never the value or its hash
        if changes.get("password_changed") or changes.get("active") is False:
            # Every session of theirs ends (a cookie copied before keeps no access), as at sign-out.
            model.session_generation = User.session_generation + 1
            changes["sessions_ended"] = True
        if changes:
            self.session.flush()
            write_audit(self.session.connection(), "update", self.audit_entity, model.id, changes)
        self.session.commit()
        if changes.get("password_changed") and active and str(model.id) == str(current_user.id):
            sign_in_again(int(model.id))  # an owner who changed their own password stays signed in here
        return True

    def get_save_return_url(self, model: Any, is_created: bool = False) -> str:
        # An owner who just stepped down (or out) may no longer open this list: go to the panel.
        if not is_created and str(model.id) == str(current_user.id) and (model.role != "owner" or not model.active):
            return url_for("admin.index")
        return super().get_save_return_url(model, is_created)
