"""The console's error pages: a person who follows a stale link or hits a bug reads, in their
language, what happened and what to do — not Werkzeug's English page.

The REST API answers JSON (admin/api/core.py has its own handlers) and the provider webhooks
and probes answer bare statuses; those paths keep their plain answers.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, jsonify, render_template, request
from flask_babel.speaklater import LazyString
from werkzeug.exceptions import HTTPException

from admin.i18n import _l, translate
from admin.json_body import too_large

#: Paths whose callers are programs, not people.
MACHINE_PREFIXES = ("/api/", "/webhooks/", "/healthz", "/readyz", "/metrics")

#: status → (title, what happened and what to do).
PAGES: dict[int, tuple[LazyString, LazyString]] = {
    400: (_l("Pedido inválido"),
          _l("O formulário expirou ou chegou incompleto. Volte, recarregue a página e tente de novo.")),
    403: (_l("Sem permissão"),
          _l("Seu perfil não pode abrir esta página. Peça a quem administra a clínica no Lembra.")),
    404: (_l("Página não encontrada"),
          _l("Este endereço não existe ou o registro foi apagado. Volte ao Painel e procure de novo.")),
    405: (_l("Ação não permitida"),
          _l("Esta página não aceita esta ação. Volte e use os botões da página.")),
    413: (_l("Envio grande demais"),
          _l("O arquivo ou o texto enviado passa do limite. Envie um arquivo menor.")),
    429: (_l("Muitas tentativas"),
          _l("Foram muitas tentativas em pouco tempo. Espere alguns minutos e tente de novo.")),
    500: (_l("Algo deu errado"),
          _l("O Lembra encontrou um erro e nada foi salvo desta vez. Tente de novo; se continuar, avise quem "
             "opera o Lembra com o horário do erro.")),
}


def _for_people() -> bool:
    return not request.path.startswith(MACHINE_PREFIXES)


def _json(exc: HTTPException) -> Any:
    """The error as the console's JSON endpoints answer theirs (`{"error": sentence}`): a request
    that sent JSON (the flow builder's) reads JSON back, whatever stopped it before its view."""
    code = exc.code or 500
    if code == 413:
        refusal = too_large()
        body = {"error": translate(refusal.message), "code": refusal.code}
    else:
        body = {"error": str(PAGES.get(code, PAGES[500] if code >= 500 else PAGES[400])[1])}
    response = jsonify(body)
    response.status_code = code
    return response


def _page(exc: HTTPException) -> Any:
    code = exc.code or 500
    title, text = PAGES.get(code, PAGES[500] if code >= 500 else PAGES[400])
    response = exc.get_response()
    response.set_data(render_template("error.html", code=code, title=title, text=text))
    response.content_type = "text/html; charset=utf-8"
    return response


def init_error_pages(app: Flask) -> None:
    """Render every HTTP error of a console path as a page in the reader's language. An
    unhandled exception reaches here as Flask's InternalServerError (and is logged by Flask)."""

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        if not _for_people():
            return exc
        if request.is_json:
            return _json(exc)
        return _page(exc)
