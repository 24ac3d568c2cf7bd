"""What every browser test shares: Chromium's flags and the real app served on loopback."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from werkzeug.serving import WSGIRequestHandler, make_server

#: Debian's headless Chromium, quiet and offline (no component updates, sync or QUIC).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


#: Where the response iterable of a request is kept, so a dropped connection can close it.
_RESPONSE_KEY = "lembra.e2e.response"


class QuietHandler(WSGIRequestHandler):
    """No access-log line per static file; errors are still logged."""

    def log_request(self, *args: object, **kwargs: object) -> None:
        pass

    def connection_dropped(self, error: BaseException, environ: Any = None) -> None:
        # Werkzeug closes the response only after draining the socket; when the browser resets
        # the connection during that drain (a font it stopped wanting), the open static file
        # is left to the garbage collector and its ResourceWarning fails whichever test runs.
        response = (environ or {}).pop(_RESPONSE_KEY, None)
        if response is not None and hasattr(response, "close"):
            response.close()


def _keep_response(app: Any) -> Any:
    """The app, recording each response iterable in its environ for ``connection_dropped``."""

    def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
        response = app(environ, start_response)
        environ[_RESPONSE_KEY] = response
        return response

    return wsgi


@contextlib.contextmanager
def serve(app: Any, name: str = "lembra-e2e-http") -> Iterator[str]:
    """The app on a free 127.0.0.1 port, threaded, in a background thread; yields its base URL."""
    httpd = make_server("127.0.0.1", 0, _keep_response(app), threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        thread.join(timeout=10)
        httpd.server_close()
