"""Every route of the app, from `app.url_map`, sorted into what the probes know how to attack.

A route is probed because it exists, not because someone listed it: a view added tomorrow (the
follow-up console under admin/views/followup/, say) is walked by the next run. What the walk cannot
fill in (a path argument whose table it cannot tell, a console view that is not tenant-scoped, an
endpoint of no known kind) is a classification error, and `test_every_route_is_classified` fails
with the route and what to add here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from flask import Flask
from flask_admin import BaseView
from flask_admin.model import BaseModelView

from admin.views.base import TenantModelView

#: Path arguments named after a table's id, wherever they appear (REST API, custom console pages).
ARG_TABLES = {
    "contact_id": "contacts", "appointment_id": "appointments", "message_id": "messages",
    "flow_id": "flow_pointers", "pointer_id": "flow_pointers", "enrollment_id": "enrollments",
    "agent_id": "agents", "channel_id": "channels", "version_id": "flow_versions", "item_id": "inbox_items",
    "rule_id": "reminder_rules", "template_id": "templates", "user_id": "users", "key_id": "api_keys",
    "event_id": "contact_events", "inbound_id": "inbound_messages", "endpoint_id": "webhook_endpoints", "delivery_id": "webhook_deliveries",
    "field_id": "conversation_fields",
    "professional_id": "professionals",
}
#: Console views that are not model views and take a bare `<id>` in their path: which table it
#: names, and what the page is. (Plain views without one need no entry: their query-string ids are
#: walked by name, QUERY_ID_PARAMS; named path arguments by ARG_TABLES.)
PLAIN_VIEWS: dict[str, tuple[str | None, str]] = {
    "admin": (None, "the dashboard: aggregates of the signed-in org only, no id"),
    "sandbox": ("sandbox_messages", "the sandbox chat: reads by contact / address, replies by sandbox message id"),
}
#: Query-string names under which console pages take an id (Flask-Admin's `id` aside): every GET
#: page of the console is walked with each of them set to another org's id and to garbage, so a page
#: that reads one of these is probed without being listed.
QUERY_ID_PARAMS = {
    "contact": "contacts", "contact_id": "contacts", "enrollment": "enrollments", "enrollment_id": "enrollments",
    "run": "enrollments", "flow": "flow_pointers", "flow_id": "flow_pointers", "pointer": "flow_pointers",
    "version": "flow_versions", "agent": "agents", "agent_id": "agents", "channel": "channels",
    "channel_id": "channels", "message": "messages", "message_id": "messages", "appointment": "appointments",
    "appointment_id": "appointments", "from": "templates", "template": "templates", "item": "inbox_items",
    "rule": "reminder_rules", "sandbox_message_id": "sandbox_messages",
}
#: Ids that console pages take in a form besides Flask-Admin's own `id`
#: (endpoint -> [(method, parameter, table)]).
EXTRA_ID_PARAMS: dict[str, list[tuple[str, str, str]]] = {
    "sandbox.index": [("GET", "contact", "contacts")],
    "sandbox.reply": [("POST", "sandbox_message_id", "sandbox_messages")],
    "templates.create_view": [("GET", "from", "templates")],
}
#: Routes that take no session and hold no org's data (what an anonymous caller may get, and why).
PUBLIC = {
    "auth.login": "the sign-in page",
    "health.healthz": "liveness, no data",
    "health.readyz": "readiness, no data",
    "health.metrics": "Prometheus counters by provider and status, no tenant data",
    "root": "a redirect to the console",
    "sandbox_bookmark": "a redirect to the sandbox page",
    "api.openapi": "the API's published description",
}
#: Signed-in actions on the user's own session, outside any view.
SESSION = {"auth.logout", "auth.set_locale"}
#: Flask-Admin's model view endpoints, by what they take.
MODEL_ENDPOINTS = {
    "index_view": "list", "details_view": "qid", "edit_view": "qid", "delete_view": "form_id",
    "action_view": "action", "export": "export", "create_view": "create", "ajax_update": "ajax",
    "ajax_lookup": "ajax",
}
_ARG = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")


@dataclass
class Route:
    rule: str
    endpoint: str
    methods: tuple[str, ...]
    #: static, public, session, api, webhook, optout, list, qid, form_id, action, export, create, ajax,
    #: custom (a console page with no id) or path_id (a console page with ids in its path).
    kind: str
    view: Any = None
    #: path argument -> table of the id it takes
    args: dict[str, str] = field(default_factory=dict)

    @property
    def table(self) -> str | None:
        """The table of the view's model (Flask-Admin's `?id=`)."""
        model = getattr(self.view, "model", None)
        return model.__tablename__ if model is not None else None

    def url(self, **values: Any) -> str:
        """The rule with its arguments replaced as given, verbatim (so garbage can be put in)."""
        def sub(match: re.Match[str]) -> str:
            name = match.group(2)
            if name not in values:
                raise KeyError(f"{self.rule}: no value for <{name}>")
            return str(values[name])
        return _ARG.sub(sub, self.rule)

    def __str__(self) -> str:
        return f"{'/'.join(self.methods)} {self.rule} ({self.endpoint})"


def console_views(app: Flask) -> dict[str, BaseView]:
    return {view.endpoint: view for admin in app.extensions.get("admin", []) for view in admin._views}


def classify(app: Flask) -> tuple[list[Route], list[str]]:
    """(every route, what could not be classified: one sentence each, saying what to do)."""
    views = console_views(app)
    routes: list[Route] = []
    errors: list[str] = []
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: (r.rule, r.endpoint)):
        endpoint = rule.endpoint
        methods = tuple(sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}))
        converters = {name: conv for conv, name in _ARG.findall(rule.rule)}
        base = dict(rule=rule.rule, endpoint=endpoint, methods=methods)
        prefix, _, name = endpoint.partition(".")
        if endpoint == "static" or endpoint.endswith(".static"):
            routes.append(Route(**base, kind="static"))
        elif endpoint in PUBLIC:
            routes.append(Route(**base, kind="public"))
        elif endpoint in SESSION:
            routes.append(Route(**base, kind="session"))
        elif endpoint == "webhooks.webhook":
            routes.append(Route(**base, kind="webhook"))
        elif endpoint == "optout.optout":
            routes.append(Route(**base, kind="optout"))
        elif prefix == "api":
            unknown = [a for a in converters if a not in ARG_TABLES]
            if unknown:
                errors.append(f"{rule.rule}: path argument(s) {unknown} name no known table; add them to "
                              "ARG_TABLES in tests/security/routes.py")
                continue
            routes.append(Route(**base, kind="api", args={a: ARG_TABLES[a] for a in converters}))
        elif prefix in views:
            view = views[prefix]
            if isinstance(view, BaseModelView):
                if not isinstance(view, TenantModelView):
                    errors.append(f"{rule.rule}: {type(view).__name__} is a Flask-Admin model view that does not "
                                  "inherit TenantModelView (admin/views/base.py): its get_one, lists and exports "
                                  "are not scoped by org")
                    continue
                table = view.model.__tablename__
                if name in MODEL_ENDPOINTS and (name != "export" or set(converters) == {"export_type"}):
                    routes.append(Route(**base, kind=MODEL_ENDPOINTS[name], view=view))
                    continue
                args = {a: (table if a == "id" else ARG_TABLES.get(a)) for a in converters}
            else:
                # A plain page: its ids come in the query string (walked by every id parameter name the
                # probe knows, see QUERY_ID_PARAMS) or in a named path argument (ARG_TABLES); a bare
                # `<id>` must be said in PLAIN_VIEWS.
                if "id" in converters and prefix not in PLAIN_VIEWS:
                    errors.append(f"{rule.rule}: {type(view).__name__} is a console view that is not a "
                                  "TenantModelView; say in PLAIN_VIEWS (tests/security/routes.py) which table its "
                                  "bare <id> names")
                    continue
                args = {a: (PLAIN_VIEWS.get(prefix, (None, ""))[0] if a == "id" else ARG_TABLES.get(a))
                        for a in converters}
            missing = [a for a, table in args.items() if table is None]
            bad_conv = [a for a in converters if converters[a] not in ("int", "")]
            if missing or bad_conv:
                errors.append(f"{rule.rule}: cannot tell which table path argument(s) {missing or bad_conv} name; "
                              "add them to ARG_TABLES (or PLAIN_VIEWS) in tests/security/routes.py")
                continue
            routes.append(Route(**base, kind="path_id" if args else "custom", view=view,
                                args={a: t for a, t in args.items() if t is not None}))
        else:
            errors.append(f"{rule.rule} ({endpoint}): an endpoint of no known kind; classify it in "
                          "tests/security/routes.py (PUBLIC with a reason, SESSION, or a console view)")
    return routes, errors
