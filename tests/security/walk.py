"""What every probed response must satisfy, and the small tools the walks share (form reading,
id values, findings collected for one clear failure message)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from tests.security.conftest import B_MARKERS

#: Ids no row can have: text, signs, zero, past bigint, NUL, non-ASCII digits, SQL.
GARBAGE_IDS = ("abc", "-1", "0", "99999999999999999999", str(2**63), "1%00", "%C2%B2", "%D9%A1%D9%A2",
               "1%27%20OR%201%3D1--")


@dataclass
class Findings:
    """Everything a walk found, reported all at once (route, input, what happened)."""

    items: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.items.append(what)

    def check(self) -> None:
        assert not self.items, f"{len(self.items)} finding(s):\n" + "\n".join(self.items[:80])


def header_problems(response: Any, *, static: bool = False) -> list[str]:
    """What a response lacks of the security headers (admin/security.py, issue 9 point 6)."""
    problems = []
    csp = response.headers.get("Content-Security-Policy", "")
    directives = {part.strip().split(" ", 1)[0]: part.strip() for part in csp.split(";") if part.strip()}
    script = directives.get("script-src", directives.get("default-src", ""))
    if not csp:
        problems.append("no Content-Security-Policy")
    else:
        if "'unsafe-inline'" in script or "'unsafe-eval'" in script or "*" in script.split():
            problems.append(f"script-src allows inline/eval/any: {script}")
        if directives.get("frame-ancestors") not in ("frame-ancestors 'none'", "frame-ancestors 'self'"):
            problems.append("no frame-ancestors 'none'")
        if directives.get("object-src") != "object-src 'none'":
            problems.append("no object-src 'none'")
    if response.headers.get("X-Frame-Options") not in ("DENY", "SAMEORIGIN"):
        problems.append("no X-Frame-Options")
    if response.headers.get("X-Content-Type-Options") != "nosniff":
        problems.append("no X-Content-Type-Options: nosniff")
    if not static and "no-store" not in response.headers.get("Cache-Control", ""):
        problems.append(f"Cache-Control is {response.headers.get('Cache-Control')!r}, not no-store")
    return problems


def b_leaks(response: Any) -> list[str]:
    text = response.get_data(as_text=True)
    return [marker for marker in B_MARKERS if marker in text]


class _FormReader(HTMLParser):
    """The fields of the page's forms that post (name -> value), as a browser would submit them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[dict[str, Any]] = []
        self._form: dict[str, Any] | None = None
        self._textarea: str | None = None
        self._select: str | None = None
        #: One entry per open <fieldset>: True when it is disabled (a browser submits none of its controls).
        self._fieldsets: list[bool] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._form = {"_action": a.get("action", ""), "_method": a.get("method", "get").lower(), "fields": {},
                          "kinds": {}}
            self.forms.append(self._form)
        if tag == "fieldset":
            self._fieldsets.append("disabled" in a)
        if self._form is None or any(self._fieldsets):
            return
        fields, kinds = self._form["fields"], self._form["kinds"]
        name = a.get("name")
        if tag == "input" and name and "disabled" not in a:
            kind = a.get("type", "text").lower()
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    fields[name] = a.get("value", "y")
            elif kind not in ("submit", "button", "file", "image", "reset"):
                fields[name] = a.get("value", "")
                kinds[name] = kind
        elif tag == "textarea" and name:
            self._textarea = name
            fields[name] = ""
            kinds[name] = "textarea"
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select:
            if self._select not in fields or "selected" in a:
                fields[self._select] = a.get("value", "")

    def handle_data(self, data: str) -> None:
        if self._form is not None and self._textarea:
            self._form["fields"][self._textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "fieldset" and self._fieldsets:
            self._fieldsets.pop()
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None
        elif tag == "form":
            self._form = None


def post_forms(html: str) -> list[dict[str, Any]]:
    reader = _FormReader()
    reader.feed(html)
    return [f for f in reader.forms if f["_method"] == "post"]


def main_form(html: str) -> tuple[dict[str, str], dict[str, str]]:
    """(fields, field kinds) of the page's biggest posting form (the edit / create form, not the
    sign-out one)."""
    forms = post_forms(html)
    # The page's own form posts back to it (no action, or its own path); the sign-out and language
    # forms every page carries post elsewhere.
    own = [f for f in forms if not f["_action"] or f["_action"].startswith(("?", "./"))] or \
        [f for f in forms if f["_action"] not in ("/logout", "/account/locale")]
    if not own:
        return {}, {}
    form = max(own, key=lambda f: len(f["fields"]))
    return dict(form["fields"]), dict(form["kinds"])


def form_posting_to(html: str, url: str) -> tuple[dict[str, str], dict[str, str]] | None:
    """(fields, kinds) of the page's form whose action is `url` (a button that posts elsewhere, as
    the contact page's hand-off and enroll forms), or None."""
    path = url.split("?", 1)[0]
    for form in post_forms(html):
        if form["_action"].split("?", 1)[0] == path:
            return dict(form["fields"]), dict(form["kinds"])
    return None


def filled(fields: dict[str, str], kinds: dict[str, str]) -> dict[str, str]:
    """A form an editor would save: its blank text fields given plausible public values (an edit
    form keeps what the page filled in; saving it unchanged is a change too: an audit row)."""
    out = dict(fields)
    n = next(_filled)
    for name in ("name", "body", "subject", "professional", "persona"):  # one real change, for edit forms
        if kinds.get(name) in ("text", "textarea") and out.get(name):
            out[name] = f"Probe {n}" + (" {{ nome }}" if name == "body" else "")
            break
    for name, kind in kinds.items():
        if out.get(name) or name == "csrf_token" or kind not in ("text", "password", "email", "url", "textarea",
                                                                  "tel", "number"):
            continue
        lowered = name.lower()
        out[name] = ("https://public.example.com/v1" if "url" in lowered else "smtp.example.com" if "host" in lowered
                     else "probe@example.com" if "email" in lowered or kind == "email"
                     else "+5516912345678" if "phone" in lowered or "number" in lowered or kind == "tel"
                     else "587" if "port" in lowered or kind == "number"
                     else "3" if lowered.endswith("seconds")
                     else f"Probe-senha-longa-{n}" if kind == "password" else f"Probe {n}")
    return out


_filled = itertools.count(1)
