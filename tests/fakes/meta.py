"""A loopback fake of Meta's Graph API (WhatsApp Cloud API) answering in the documented wire format.

Fixtures: tests/fixtures/providers/meta_whatsapp/ (how each was written and its sources:
tests/fixtures/providers/README.md):
- 200 send answer: `send_response.json` (the documented `{messaging_product, contacts, messages[{id}]}`);
- error answers: Graph's `{"error": {...}}` envelope around an error object (`error_*.json`, in the
  shape Meta documents); codes without a fixture (130429, 131056, 131026, …) are built here from
  the same shape and Meta's code table;
- `GET /{waba_id}/message_templates`: the WABA's templates in pages (`message_templates_page*.json`:
  `data` and `paging{cursors{before, after}, next}`, `next` only while another page follows),
  the next page asked with `after=<cursors.after>`.
"""

from __future__ import annotations

import base64
from typing import Any

from tests.fakes.server import FakeServer, Recorded, Reply
from tests.fixtures import fixture_bytes, fixture_json

SAMPLES = "meta_whatsapp/"


def sample_json(name: str) -> Any:
    """A fixture of tests/fixtures/providers/meta_whatsapp/, parsed (a fresh copy each call)."""
    return fixture_json(SAMPLES + name)


def send_ok() -> Reply:
    """Meta's documented 200 answer to POST /{phone_number_id}/messages."""
    return Reply(200, fixture_bytes(SAMPLES + "send_response.json"))


def graph_error(inner: dict[str, Any], status: int = 400, headers: dict[str, str] | None = None) -> Reply:
    """A Graph error answer: the documented `{"error": {...}}` envelope around an error object."""
    return Reply(status, {"error": inner}, headers=dict(headers or {}))


def fixture_error(name: str, status: int = 400) -> Reply:
    """An error object fixture (error_*.json) as a synchronous Graph error."""
    return graph_error(sample_json(name), status)


def notes_error(code: int, title: str, status: int = 400, headers: dict[str, str] | None = None) -> Reply:
    """An error in Graph's documented error syntax (message "(#code) title", type, code, error_data,
    fbtrace_id: Meta's "Error response syntax", cited in tests/fixtures/providers/README.md)."""
    return graph_error({
        "message": f"(#{code}) {title}",
        "type": "OAuthException",
        "code": code,
        "error_data": {"messaging_product": "whatsapp", "details": title},
        "fbtrace_id": "AbCdEfGhIjKlMnOp",
    }, status, headers)


def phone_number_node() -> Reply:
    """GET /{phone_number_id}?fields=… — Graph's phone-number node (no published sample; the
    fields named in the provider's HEALTH_FIELDS with illustrative values)."""
    return Reply(200, {"display_phone_number": "15550953877", "verified_name": "Clinica Teste",
                       "quality_rating": "GREEN", "id": "277321005464405"})


def waba_templates() -> list[dict[str, Any]]:
    """Every template of the fixtures' WABA (both pages' `data`), fresh copies."""
    return [*sample_json("message_templates_page1.json")["data"], *sample_json("message_templates_page2.json")["data"]]


def _cursor(kind: str, index: int) -> str:
    return base64.urlsafe_b64encode(f"lembra-{kind}-{index}".encode()).decode().rstrip("=")


def template_pages(templates: list[dict[str, Any]], waba_id: str, page_size: int = 3) -> list[dict[str, Any]]:
    """`templates` as Graph pages them (the fixtures' shape): `data`, `paging.cursors`, and `next`
    (an absolute graph.facebook.com URL) on every page but the last."""
    pages: list[dict[str, Any]] = []
    for start in range(0, max(len(templates), 1), page_size):
        chunk = templates[start:start + page_size]
        after = _cursor("after", start + len(chunk))
        paging: dict[str, Any] = {"cursors": {"before": _cursor("before", start), "after": after}}
        if start + page_size < len(templates):
            paging["next"] = (f"https://graph.facebook.com/v23.0/{waba_id}/message_templates?limit={page_size}"
                              f"&after={after}")
        pages.append({"data": chunk, "paging": paging})
    return pages


def templates_answer(request: Recorded, pages: list[dict[str, Any]]) -> Reply:
    """The page of `pages` that `request`'s `after` cursor asks for (the first without one); an
    unknown cursor is Graph's invalid-parameter error."""
    after = (request.query.get("after") or [None])[0]
    if after is None:
        return Reply(200, pages[0])
    for previous, page in zip(pages, pages[1:]):
        if previous["paging"]["cursors"]["after"] == after and "next" in previous["paging"]:
            return Reply(200, page)
    return notes_error(100, "Invalid parameter")


class FakeGraph(FakeServer):
    """Answers scripted replies in order, then `default` (the documented 200 send answer); a GET of
    `/{waba_id}/message_templates` with no script left gets `template_pages` (the fixtures' two pages
    unless set).

    One server can serve many tests: `reset(...)` forgets the recorded requests and sets a new script.
    """

    def __init__(self, *script: Reply, default: Reply | None = None) -> None:
        super().__init__(self._answer)
        # A scripted delay outlives the client's timeout, so the late answer hits a closed socket;
        # that is the point of the delay, not an error worth a traceback on stderr.
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.reset(*script, default=default)

    def reset(self, *script: Reply, default: Reply | None = None,
              template_pages: list[dict[str, Any]] | None = None) -> "FakeGraph":
        with self._lock:
            self.requests.clear()
            self.script = list(script)
            self.default = default or send_ok()
            self.media: dict[str, bytes] = {}
            self.template_pages = template_pages or [sample_json("message_templates_page1.json"),
                                                     sample_json("message_templates_page2.json")]
        return self

    def _answer(self, request: Recorded) -> Reply:
        with self._lock:
            if self.script:
                return self.script.pop(0)
            media_id = request.path.rsplit("/", 1)[-1]
            if request.method == "GET" and media_id in self.media:
                if request.path.startswith("/media-download/"):  # the url lookaside.fbsbx.com serves
                    return Reply(200, self.media[media_id], {"Content-Type": "audio/ogg"})
                # Retrieve media URL: GET /{version}/{media_id} ("url" valid 5 minutes).
                return Reply(200, {"messaging_product": "whatsapp", "url": f"{self.url}/media-download/{media_id}",
                                   "mime_type": "audio/ogg", "sha256": "0" * 64,
                                   "file_size": len(self.media[media_id]), "id": media_id})
            if request.method == "GET" and request.path.endswith("/message_templates"):
                return templates_answer(request, self.template_pages)
            return self.default
