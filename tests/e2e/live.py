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


class QuietHandler(WSGIRequestHandler):
    """No access-log line per static file; errors are still logged."""

    def log_request(self, *args: object, **kwargs: object) -> None:
        pass


@contextlib.contextmanager
def serve(app: Any, name: str = "lembra-e2e-http") -> Iterator[str]:
    """The app on a free 127.0.0.1 port, threaded, in a background thread; yields its base URL."""
    httpd = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        thread.join(timeout=10)
        httpd.server_close()
