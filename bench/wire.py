"""The bare-wire baseline: how fast plain `requests` (or plain urllib3) can post Lembra's body to the fake.

bench/throughput.py runs this with the same number of processes and threads as the workers
(W processes x T threads, multiprocessing) against the same fake, so "Lembra's rate as a fraction
of the bare wire" isolates what the engine costs on top of the HTTP call itself on this machine.

Each thread has its own `requests.Session` (trust_env=False: no proxy or netrc look-ups from the
environment; keep-alive, so one connection per thread is reused) and posts the JSON body the fake
captured from Lembra's own sends, with `biz_opaque_callback_data` replaced by a `wire-…` reference
the fake counts apart. Like the engine, it reads the answer as JSON and takes `messages[0].id`.

`--client urllib3` posts through a urllib3 connection pool instead, the way gateway/http.py's
`Client` does since 2026-12-03: the issue's goal is stated against `requests`, and this second
baseline shows how Lembra compares with the cheapest client it could itself use.

    python bench/wire.py --url http://127.0.0.1:PORT/v26.0/123/messages --processes 2 --threads 8
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from typing import Any

import requests

TOKEN = "EAAbenchwiretoken000000000"


def _thread(url: str, token: str, body: dict[str, Any], tag: str, until: float, counts: list[int],
            errors: list[int], index: int, client: str = "requests") -> None:
    if client == "urllib3":
        _thread_urllib3(url, token, body, tag, until, counts, errors, index)
        return
    session = requests.Session()
    session.trust_env = False
    headers = {"Authorization": f"Bearer {token}"}
    n = 0
    while time.monotonic() < until:
        payload = dict(body, biz_opaque_callback_data=f"wire-{tag}-{n}")
        try:
            response = session.post(url, json=payload, headers=headers, timeout=10, allow_redirects=False)
            # The engine reads the body as JSON and takes messages[0].id: do the same work.
            if response.status_code == 200 and response.json()["messages"][0]["id"]:
                n += 1
            else:
                errors[index] += 1
        except (requests.RequestException, ValueError, KeyError, IndexError):
            errors[index] += 1
    counts[index] = n
    session.close()


def _thread_urllib3(url: str, token: str, body: dict[str, Any], tag: str, until: float, counts: list[int],
                    errors: list[int], index: int) -> None:
    """`_thread` with a urllib3 pool of one keep-alive connection: JSON encoded and decoded by hand."""
    import urllib3

    parsed = urllib3.util.parse_url(url)
    pool = urllib3.HTTPConnectionPool(parsed.host, parsed.port, maxsize=1)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    timeout = urllib3.Timeout(connect=10, read=10)
    n = 0
    while time.monotonic() < until:
        payload = json.dumps(dict(body, biz_opaque_callback_data=f"wire-{tag}-{n}")).encode()
        try:
            response = pool.urlopen("POST", parsed.request_uri, body=payload, headers=headers, timeout=timeout,
                                    retries=False, redirect=False)
            if response.status == 200 and json.loads(response.data)["messages"][0]["id"]:
                n += 1
            else:
                errors[index] += 1
        except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError, IndexError):
            errors[index] += 1
    counts[index] = n
    pool.close()


def _process(url: str, token: str, body: dict[str, Any], threads: int, ready: Any, go: Any, seconds: float,
             out: Any, client: str = "requests") -> None:
    """One process: T threads posting for `seconds` once the parent says go (all start together,
    after every interpreter has finished importing)."""
    ready.put(os.getpid())
    go.wait()
    counts, errors = [0] * threads, [0] * threads
    cpu0 = time.process_time()
    until = time.monotonic() + seconds
    pool = [threading.Thread(target=_thread, args=(url, token, body, f"{os.getpid()}-{i}", until, counts, errors, i,
                                                   client))
            for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put({"sent": sum(counts), "errors": sum(errors), "cpu_s": time.process_time() - cpu0})


def run_wire(url: str, body: dict[str, Any], *, processes: int, threads: int, seconds: float,
             token: str = TOKEN, client: str = "requests") -> dict[str, Any]:
    """Post for `seconds` from W x T threads with `client` (requests or urllib3); returns the rate
    and the client CPU per request."""
    ctx = mp.get_context("spawn")  # a clean interpreter, like a worker process (no inherited pools)
    queue, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_process, args=(url, token, body, threads, ready, go, seconds, queue, client))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    go.set()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    sent = sum(r["sent"] for r in results)
    cpu = sum(r["cpu_s"] for r in results)
    return {"client": client, "processes": processes, "threads": threads, "seconds": seconds, "sent": sent,
            "errors": sum(r["errors"] for r in results), "messages_per_s": round(sent / seconds, 1),
            "client_cpu_ms_per_request": round(1000 * cpu / max(sent, 1), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--client", choices=("requests", "urllib3"), default="requests")
    p.add_argument("--body", default='{"messaging_product":"whatsapp","to":"5511900000001","type":"text",'
                                     '"text":{"body":"hello"}}')
    args = p.parse_args(argv)
    print(json.dumps(run_wire(args.url, json.loads(args.body), processes=args.processes, threads=args.threads,
                              seconds=args.seconds, client=args.client)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
