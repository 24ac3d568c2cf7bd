"""Conversation turn latency: a patient's reply in through the webhook, the `ask` node's next question out.

    .venv/bin/python bench/conversations.py --rate 20 --duration 60
    .venv/bin/python bench/conversations.py --rate 20 --duration 20 --debounce 8     # the org's default
    .venv/bin/python bench/conversations.py --rate 20 --duration 20 --dispatch-interval 2
    .venv/bin/python bench/conversations.py --rate 20 --duration 60 --consumer-idle-ms 50
    .venv/bin/python bench/conversations.py --rate 50 --duration 60 --contacts 3000 --inline 300
    .venv/bin/python bench/conversations.py --duration 0 --contacts 0 --inline 300 --inline-profile  # in process only

What it measures (see docs/benchmarks.md for the current figures, and docs/benchmarks-history.md,
"Conversations: turn latency", for the runs): the
time from the moment Lembra's webhook endpoint (admin/webhooks.py, under `lembra web`) answers
200 to a signed Meta inbound-text notification, to the moment the engine's reply reaches the
provider: the Meta channel's `base_url` is bench/http_fake.py, a loopback process that stamps each
send's arrival with the machine's monotonic clock (the same clock in every process, so the two
instants compare). Nothing in between is faked: PostgreSQL, the Redis broker, `lembra web`,
`lembra worker` and `lembra scheduler` run as a deployment runs them, and the reply goes
webhook → `process_inbound` (a worker) → the enrollment due now → claimed and advanced → the
ask's question in the outbox → claimed and sent → the fake. While the worker process has read at
most 3 replies in the last second, that worker claims, advances and sends itself
(engine/messaging/turn.py, since 2026-12-07, session 11); otherwise, and after a debounce, the
scheduler's next pass claims the run for `advance_enrollments` (a worker) and a later pass the
question for `send_messages` (a worker), batched with the other turns due.

1. creates a fresh PostgreSQL database (default `lembra_bench_conversations`), one clinic (a
   00:00-23:59 window with no Sunday or holiday skipping; `orgs.reply_debounce_seconds` set to
   `--debounce`, 0 by default: the debounce is a deliberate wait for more fragments of a turn,
   not work), a Meta channel pointing at the fake, the fields `periodo` and `data`
   (engine/flows/conversation/fields.py), and a manual flow `trigger → ask(periodo, data) → end`
   published through `engine.flows.versions`;
2. COPYs `--contacts` contacts with WhatsApp consent, each with one earlier message on the channel
   (so Meta's 24-hour window is open and the questions go as free text), enrolls every contact
   with `engine.flows.triggers.enroll`, starts the processes and lets them ask the first question
   ("De manhã, à tarde ou à noite?") to everyone: the setup, not measured;
3. the bare limit, in the same run: for `--bare-seconds` at the same rate, this process posts the
   body Lembra posted straight to the fake with urllib3 (the client the providers use) and
   measures from just before the post to the fake's arrival stamp: the webhook → fake round trip
   with no engine work, measured the way the turns are;
4. the turns: at a steady `--rate` a second for `--duration` seconds (open loop: each webhook is
   posted at its scheduled instant by a pool of client threads, whether or not the earlier ones
   were answered), one contact at a time answers "pode ser de manhã" (or another phrasing that
   gives only the period); the ask takes the period and asks "Qual dia fica melhor para você?";
5. waits `--drain` seconds at most for the replies (and a little longer for any duplicate), then
   prints turn latency p50/p95/p99/max beside the bare limit, the webhook's own answer time, the
   hops of a turn from the database's timestamps (stored → processed by a worker → stepped →
   sent), the checks (every turn got exactly one reply with the expected question, none twice,
   none lost, nothing else sent; counted at the fake), CPU per turn by component and the machine
   (bench/throughput.py's helpers). The exit status is 1 when a check fails;
6. `--inline N` then enrolls N more contacts and runs their turns one at a time inside this
   process, through the functions the processes run (`receive`, `process_inbound`,
   `turn.answer_now` with its claims, `advance_claimed` and `send_batch` to the fake, then the
   scheduler's claims for anything left), counting every statement
   (bench/flows.py's StatementCounter), transaction, and the CPU and wall of each stage, and
   checks at the fake that each got exactly one reply (the exit status is 1 otherwise); beside
   them, N wait → end advances measured by bench/flows.py's own `run_inline` in the same database.
   `--inline-profile` runs the turns under cProfile (CPU timer) and saves the profile in the logs.

The issue's aim is p99 ≤ 500 ms with the built-in reader (no model call).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import hmac
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402
import urllib3  # noqa: E402
from sqlalchemy import update  # noqa: E402

from bench.flows import StatementCounter, load_contacts, profile_summary, run_inline  # noqa: E402
from bench.flows import graph as wait_graph  # noqa: E402
from bench.throughput import (  # noqa: E402
    Children,
    FakeProcess,
    Sampler,
    _terminated,
    code_version,
    create_database,
    drop_database,
    engine_env,
    fake_channel_credentials,
    log,
    machine_info,
    pick_timezone,
    sqlalchemy_url,
    wait_for_workers,
)
from engine.core.logs import configure as configure_logs  # noqa: E402
from engine.flows import triggers, versions  # noqa: E402
from engine.flows.conversation.fields import create_field  # noqa: E402
from engine.store.db import Database  # noqa: E402
from engine.store.migrate import upgrade  # noqa: E402
from engine.store.models import orgs  # noqa: E402
from engine.tenants.channels import create_channel  # noqa: E402
from engine.tenants.orgs import create_org  # noqa: E402
from gateway.crypto import Keyring  # noqa: E402

UTC = timezone.utc
ASK_NODE = "pergunta"
PERIOD_QUESTION = "De manhã, à tarde ou à noite?"
DAY_QUESTION = "Qual dia fica melhor para você?"
#: What a patient answers to the period question: each gives the period and no day, so the ask
#: takes the period and asks for the day (one outbound message per turn).
REPLIES = ("pode ser de manhã", "pode ser à tarde", "de manhã, por favor", "prefiro de tarde")
#: The channel's index in bench/throughput.py's fake Meta credentials (its app secret signs the webhooks).
CHANNEL_INDEX = 0
#: After the last expected reply, how long the fake is watched for a duplicate.
DUPLICATE_WATCH_S = 3.0


def graph() -> dict[str, Any]:
    """trigger → ask(periodo, data) → end, with the ask's three exits."""
    nodes = [{"id": "inicio", "type": "trigger", "config": {}},
             {"id": ASK_NODE, "type": "ask", "config": {"fields": ["periodo", "data"], "max_asks": 3,
                                                       "grace_minutes": 240}},
             {"id": "pronto", "type": "end", "config": {"outcome": "converted"}},
             {"id": "desistiu", "type": "end", "config": {"outcome": "exhausted"}},
             {"id": "calado", "type": "end", "config": {"outcome": "custom"}}]
    edges = [{"source": "inicio", "target": ASK_NODE, "condition": {"type": "always"}},
             {"source": ASK_NODE, "target": "pronto", "condition": {"type": "complete"}},
             {"source": ASK_NODE, "target": "desistiu", "condition": {"type": "gave_up"}},
             {"source": ASK_NODE, "target": "calado", "condition": {"type": "no_reply"}}]
    return {"nodes": nodes, "edges": edges}


def wa_id(contact_id: int) -> str:
    """The WhatsApp id of bench.flows.load_contacts's contact (`+55119{id:08d}`)."""
    return f"55119{contact_id:08d}"


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def create_clinic(db: Database, keyring: Keyring, tz: str, debounce: int, fake_base_url: str) -> dict[str, Any]:
    """One org, its Meta channel (at the fake), the two fields and the published flow."""
    credentials = fake_channel_credentials(CHANNEL_INDEX, fake_base_url)
    with db.begin() as conn:
        org_id = create_org(conn, slug="bench-conversations", name="Clínica Bench Conversas", timezone=tz, state="SP",
                            quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
        conn.execute(update(orgs).where(orgs.c.id == org_id).values(reply_debounce_seconds=debounce))
        channel_id = create_channel(conn, keyring, org_id=org_id, kind="whatsapp", provider="meta",
                                    name="WhatsApp (Meta, loopback fake)", credentials=credentials, is_default=True)
        create_field(conn, org_id, {"slug": "periodo", "label": "Período", "type": "period",
                                    "question": PERIOD_QUESTION})
        create_field(conn, org_id, {"slug": "data", "label": "Data", "type": "date", "question": DAY_QUESTION})
        pointer_id = versions.create_flow(conn, org_id, name="Remarcar (bench)", draft_graph=graph(),
                                          trigger_config={"kind": "manual"})
        version = versions.publish(conn, org_id, pointer_id)
    return {"org_id": org_id, "channel_id": channel_id, "pointer_id": pointer_id, "version_id": int(version.id),
            "app_secret": credentials["app_secret"]}


def open_windows(conninfo: str, clinic: dict[str, Any], count: int) -> None:
    """One earlier message per contact on the channel, already processed: Meta's 24-hour window is
    open, so the ask's questions go as free text (as they do in a conversation the patient began)."""
    earlier = datetime.now(UTC) - timedelta(minutes=10)
    with psycopg.connect(conninfo) as conn:
        with conn.cursor().copy("COPY inbound_messages (org_id, channel_id, provider_message_id, contact_id, "
                                "from_address, text, received_at, processed_at, outcome) FROM STDIN") as copy:
            for cid in range(1, count + 1):
                copy.write_row((clinic["org_id"], clinic["channel_id"], f"wamid.bench-open-{cid}", cid,
                                f"+{wa_id(cid)}", "Oi, preciso remarcar", earlier, earlier, "free_text"))


def enroll_all(db: Database, clinic: dict[str, Any], contact_ids: range) -> float:
    """Enroll every contact through the engine's own function, 200 to a transaction."""
    started = time.perf_counter()
    for first in range(contact_ids.start, contact_ids.stop, 200):
        with db.begin() as conn:
            for cid in range(first, min(first + 200, contact_ids.stop)):
                result = triggers.enroll(conn, clinic["org_id"], clinic["pointer_id"], cid, trigger_kind="manual",
                                         trigger_key=f"manual:bench:{cid}", automatic=False)
                assert result.enrollment_id is not None, result.reason
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# The wire: webhooks in, the fake's arrival stamps
# ---------------------------------------------------------------------------------------------


def inbound_body(contact_id: int, message_id: str, text: str) -> bytes:
    """A Meta `whatsapp_business_account` notification carrying one inbound text."""
    sender = wa_id(contact_id)
    return json.dumps({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{
        "field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "551633334444", "phone_number_id": "106540352242922"},
            "contacts": [{"profile": {"name": f"Paciente {contact_id}"}, "wa_id": sender}],
            "messages": [{"from": sender, "id": message_id, "timestamp": str(int(time.time())), "type": "text",
                          "text": {"body": text}}]}}]}]}).encode()


def fake_arrivals(fake: FakeProcess) -> list[tuple[float, str, str | None, str | None]]:
    """Every send the fake answered since its last reset: (monotonic, to, reference, text)."""
    return [tuple(row) for row in fake._call("GET", "/arrivals")]  # type: ignore[misc]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_web(port: int, children: Children, timeout: float = 60) -> float:
    """Wait until `lembra web` answers /healthz."""
    http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=1, read=5))
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if http.request("GET", f"http://127.0.0.1:{port}/healthz").status == 200:
                return time.monotonic() - started
        except urllib3.exceptions.HTTPError:
            pass
        dead = {k: v for k, v in children.alive().items() if v is not None}
        if dead:
            raise SystemExit(f"a process exited early: {dead}; see {children.logdir}")
        time.sleep(0.2)
    raise SystemExit(f"lembra web not answering after {timeout:.0f}s; see {children.logdir}")


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """p50/p95/p99/max (nearest rank) in milliseconds, and how many."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))]

    return {"n": len(ordered), "p50": round(1000 * rank(0.50), 1), "p95": round(1000 * rank(0.95), 1),
            "p99": round(1000 * rank(0.99), 1), "max": round(1000 * ordered[-1], 1)}


def paced(rate: float, count: int, job: Any, threads: int) -> float:
    """Call `job(i)` for i in 0..count-1 at `rate` a second, open loop (a pool of `threads`
    posts each at its instant, however long the earlier ones take); returns the largest lag of
    a scheduled instant behind the clock (the generator's own lateness)."""
    lag = 0.0
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="turn") as pool:
        start = time.monotonic() + 0.05
        for i in range(count):
            at = start + i / rate
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                lag = max(lag, -delay)
            pool.submit(job, i)
    return lag


def measure_bare(fake: FakeProcess, body: dict[str, Any], rate: float, seconds: float, threads: int) -> dict[str, Any]:
    """The same round trip with no engine work: post Lembra's own body to the fake with urllib3
    and measure from just before the post to the fake's arrival stamp, at the turns' rate."""
    fake.reset()
    url = f"{fake.base_url}/{fake_channel_credentials(CHANNEL_INDEX, '')['phone_number_id']}/messages"
    pool = urllib3.PoolManager(maxsize=threads, retries=False, timeout=urllib3.Timeout(connect=5, read=10))
    headers = {"Authorization": "Bearer EAAbenchwiretoken000000000", "Content-Type": "application/json"}
    count = max(1, int(rate * seconds))
    started: dict[str, float] = {}
    errors = [0]

    def post(i: int) -> None:
        reference = f"wire-{i}"
        payload = json.dumps(dict(body, biz_opaque_callback_data=reference, to=f"5511800{i:06d}")).encode()
        started[reference] = time.monotonic()
        try:
            response = pool.urlopen("POST", url, body=payload, headers=headers)
            if response.status != 200 or not json.loads(response.data)["messages"][0]["id"]:
                errors[0] += 1
        except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError):
            errors[0] += 1

    paced(rate, count, post, threads)
    arrivals = {ref: t for t, _to, ref, _text in fake_arrivals(fake) if ref}
    latencies = [arrivals[ref] - t0 for ref, t0 in started.items() if ref in arrivals]
    fake.reset()
    return {"posts": count, "errors": errors[0], "arrived": len(latencies), "latency_ms": percentiles(latencies)}


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rate", type=float, default=20, help="turns a second, steady")
    p.add_argument("--duration", type=float, default=60, help="seconds of turns")
    p.add_argument("--contacts", type=int, default=2000,
                   help="enrolled contacts waiting at the ask; each answers once, so >= rate x duration")
    p.add_argument("--debounce", type=int, default=0,
                   help="the org's reply_debounce_seconds (engine default 8: a deliberate wait for more fragments)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (`lembra worker --processes`)")
    p.add_argument("--threads", type=int, default=None, help="send threads per worker process (engine default)")
    p.add_argument("--conversation-threads", type=int, default=None,
                   help="reply/step threads per worker process (engine default)")
    p.add_argument("--consumer-idle-ms", type=int, default=None,
                   help="dramatiq_worker_timeout of the workers: the longest an idle queue consumer sleeps between "
                        "polls of Redis (Dramatiq's default 1000; it backs off 5, 10, 20 … ms up to it)")
    p.add_argument("--web-workers", type=int, default=2, help="gunicorn workers of `lembra web`")
    p.add_argument("--dispatch-interval", default="0.2",
                   help="LEMBRA_DISPATCH_INTERVAL of the scheduler (the engine's default is 2)")
    p.add_argument("--client-threads", type=int, default=16, help="threads posting the webhooks (open loop)")
    p.add_argument("--inline", type=int, default=0, metavar="N",
                   help="then N more turns one at a time in this process, every statement counted, and N wait → end "
                        "advances beside them (bench/flows.py's inline); with --duration 0, only these")
    p.add_argument("--inline-profile", action="store_true", help="run the inline turns under cProfile")
    p.add_argument("--bare-seconds", type=float, default=15, help="seconds of the bare-limit phase (0: skip)")
    p.add_argument("--drain", type=float, default=60, help="seconds to wait for the last replies")
    p.add_argument("--db-name", default="lembra_bench_conversations")
    p.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres", help="libpq server connection")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/14", help="broker URL; its db is FLUSHDB'd")
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    if not args.db_name.startswith("lembra_bench"):
        p.error("--db-name must start with lembra_bench (the database is dropped)")
    if args.rate <= 0 or args.duration < 0 or args.inline < 0 or not (args.duration or args.inline):
        p.error("--rate must be positive, and --duration or --inline too")
    if int(args.rate * args.duration) > args.contacts:
        p.error(f"{int(args.rate * args.duration)} turns need as many contacts: raise --contacts")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    configure_logs("WARNING", "text")
    conninfo = f"{args.pg} dbname={args.db_name}"
    database_url = sqlalchemy_url(args.pg, args.db_name)
    report: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}
    report["machine"] = machine_info(f"{args.pg} dbname=postgres", args.redis)
    report["code"] = code_version()
    m = report["machine"]
    log(f"machine: {m['nproc']} CPU ({m['cpu_model']}), {m['memory_gib']} GiB, Python {m['python']}, "
        f"{m['postgresql']}, Redis {m['redis']}, load {m['loadavg_before']}; code {report['code']['commit']}"
        + (" + uncommitted engine changes" if report["code"]["engine_dirty"] else ""))
    create_database(args.pg, args.db_name)
    ok = False
    try:
        ok = _run(args, conninfo, database_url, report)
    finally:
        if args.keep:
            log(f"kept database {args.db_name}")
        else:
            drop_database(args.pg, args.db_name)
            log(f"dropped database {args.db_name}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
            log(f"figures written to {args.json}")
    return 0 if ok else 1


def _run(args: argparse.Namespace, conninfo: str, database_url: str, report: dict[str, Any]) -> bool:
    upgrade(database_url)
    secret_keys = Keyring.generate_spec()
    keyring = Keyring.parse(secret_keys)
    logdir = Path(tempfile.mkdtemp(prefix="lembra-bench-conversations-"))
    fake = FakeProcess(logdir)
    db = Database(database_url)
    ok = True
    try:
        clinic = create_clinic(db, keyring, pick_timezone(), args.debounce, fake.base_url)
        # Ids 1..contacts for the processes' turns, then `--inline` for the inline turns, then
        # `--inline` for the inline advances (bench/flows.py's run_inline takes the ids after them).
        load_contacts(conninfo, clinic["org_id"], args.contacts + 2 * args.inline + ADVANCE_WARM_UP)
        open_windows(conninfo, clinic, args.contacts + args.inline)
        report["setup"] = {"contacts": args.contacts, "debounce_s": args.debounce,
                           "flow": "trigger → ask(periodo, data) → end", "logdir": str(logdir)}
        if args.duration > 0:
            enroll_s = enroll_all(db, clinic, range(1, args.contacts + 1))
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
            log(f"{args.contacts:,} contacts enrolled in {enroll_s:.1f}s; org debounce {args.debounce}s; "
                f"logs in {logdir}")
            report["setup"]["enroll_s"] = round(enroll_s, 1)
            ok = _with_processes(args, conninfo, database_url, secret_keys, clinic, fake, logdir, report)
        if args.inline:
            log(f"inline: {args.inline:,} turns one at a time in this process, counting every statement")
            report["inline"] = inline_turns(args, db, database_url, secret_keys, clinic, fake, logdir)
            ok = ok and report["inline"]["checks"]["ok"]
            log(f"inline: {args.inline:,} wait → end advances in this process (bench/flows.py's run_inline)")
            report["advance"] = inline_advances(args, db, conninfo, database_url, secret_keys, clinic)
        _print_summary(report)
        return ok
    finally:
        db.dispose()
        fake.stop()


# ---------------------------------------------------------------------------------------------
# Inline: one turn at a time in this process, every statement counted
# ---------------------------------------------------------------------------------------------

#: The claim size of the inline advances (the engine's default send batch, as bench/flows.py's
#: inline uses), and the first claim, advanced to warm up outside the counts.
ADVANCE_WARM_UP = 200
#: Seconds between two sends to one person on Meta (its provider's `recipient_interval`), and a margin.
RECIPIENT_INTERVAL_S = 6.5
#: A turn's stages in this process, as the deployment splits them between its processes.
STAGES = ("web: receive", "worker: process_inbound", "worker: answer_now", "scheduler: claim step",
          "worker: advance", "scheduler: claim send", "worker: send")


def inline_turns(args: argparse.Namespace, db: Database, database_url: str, secret_keys: str,
                 clinic: dict[str, Any], fake: FakeProcess, logdir: Path) -> dict[str, Any]:
    """`--inline` more contacts enrolled and asked the first question in this process, then each
    answers once, one turn at a time, through the functions the processes run: `receive` (the
    webhook's work), `process_inbound`, `turn.answer_now` (the worker's claim, `advance_claimed`,
    its claim and `send_batch` to the fake, over HTTP), then what a scheduler pass would still
    find (`claim_due` of runs, `advance_claimed`, `claim_due` of messages, `send_batch`: nothing
    when the worker answered). Counts the statements,
    transactions, CPU and wall of each stage (with `--inline-profile`, under cProfile, whose
    overhead then inflates the CPU), and checks at the fake that every turn got exactly one reply
    with the day question."""
    from engine.core.config import Settings
    from engine.flows import runtime as flows_runtime
    from engine.messaging import dispatch, turn
    from engine.messaging.inbound import process_inbound, receive
    from engine.store.runtime import Runtime, install
    from gateway.contract import WebhookRequest

    k = args.inline
    ids = range(args.contacts + 1, args.contacts + 1 + k)
    enroll_all(db, clinic, ids)
    env_args = argparse.Namespace(redis=args.redis, dispatch_interval=args.dispatch_interval, populate_interval="3600",
                                  provider="http-fake", send_batch=None, claim_batch=None, send_concurrency=None)
    settings = Settings.from_env({**engine_env(env_args, database_url, secret_keys), "BROKER_URL": "stub://"})
    rt = Runtime.build(settings)
    previous = install(rt)
    counter = StatementCounter(rt.db.engine)
    # CPU time, not wall: waiting for PostgreSQL or the fake costs this process nothing.
    profiler = cProfile.Profile(time.process_time) if args.inline_profile else None
    secret = clinic["app_secret"].encode()
    warm = min(20, max(1, k // 10))
    statements = {name: Counter() for name in STAGES}
    commits = dict.fromkeys(STAGES, 0)
    cpu = dict.fromkeys(STAGES, 0.0)
    wall = dict.fromkeys(STAGES, 0.0)

    def stage(name: str, measured: bool, fn: Any, *fn_args: Any) -> Any:
        """Run one stage, counted when `measured`. A claim that finds nothing is not counted: the
        scheduler's passes poll whether or not a turn is due (at 50 turns a second one pass claims
        several), so the empty claim that ends each drain here is not a turn's work."""
        if not measured:
            return fn(*fn_args)
        counter.reset()
        counter.on = True
        if profiler is not None:
            profiler.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn(*fn_args)
        spent, took = time.process_time() - c0, time.perf_counter() - t0
        if profiler is not None:
            profiler.disable()
        counter.on = False
        if result or not name.startswith("scheduler"):
            cpu[name] += spent
            wall[name] += took
            statements[name].update(counter.statements)
            commits[name] += counter.commits
        return result

    def drain(measured: bool) -> tuple[int, int]:
        """What the scheduler and the workers do after a reply: claim and advance the due runs,
        then claim and send what they queued."""
        steps = sent = 0
        while pairs := stage("scheduler: claim step", measured, lambda: flows_runtime.claim_due(
                rt, limit=settings.claim_batch)):
            steps += stage("worker: advance", measured, flows_runtime.advance_claimed, rt, pairs)
        while message_ids := stage("scheduler: claim send", measured, lambda: dispatch.claim_due(
                rt, limit=settings.send_batch)):
            stage("worker: send", measured, dispatch.send_batch, rt, message_ids)
            sent += len(message_ids)
        return steps, sent

    try:
        first_steps, first_sent = drain(False)  # the first question to everyone: the setup
        # Meta spaces two sends to one person (6 s, the provider's `recipient_interval`): a reply
        # sooner than that after the first question would be deferred past these drains and counted
        # lost. A patient answers after reading the question; wait the interval out once.
        time.sleep(RECIPIENT_INTERVAL_S)
        fake.reset()
        left = 0  # replies the worker's answer left to a scheduler pass
        for n, cid in enumerate(ids):
            measured = n >= warm
            raw = inbound_body(cid, f"wamid.bench-inline-{cid}", REPLIES[n % len(REPLIES)])
            request = WebhookRequest(method="POST", url=f"http://bench/webhooks/meta/{clinic['channel_id']}",
                                     headers={"Content-Type": "application/json", "X-Hub-Signature-256": "sha256="
                                              + hmac.new(secret, raw, hashlib.sha256).hexdigest()}, body=raw)
            received = stage("web: receive", measured, receive, rt, "meta", clinic["channel_id"], request)
            for inbound_id in received.inbound_ids:
                if stage("worker: process_inbound", measured, process_inbound, rt, inbound_id) is not None:
                    # One turn at a time, as a quiet process takes them: its replies of the last
                    # second (these turns come back to back) do not send it to the scheduler's path.
                    turn.recent = turn.RecentReplies()
                    stage("worker: answer_now", measured, turn.answer_now, rt, inbound_id)
            left += drain(measured)[1]
    finally:
        install(previous)
        rt.close()
    measured_turns = k - warm
    by_to: dict[str, list[str | None]] = defaultdict(list)
    for _t, to, _ref, text in fake_arrivals(fake):
        by_to[to].append(text)
    answered = [by_to.get(wa_id(cid), []) for cid in ids]
    checks = {"replied_once": sum(len(r) == 1 for r in answered), "lost": sum(not r for r in answered),
              "duplicated": sum(len(r) > 1 for r in answered),
              "wrong_text": sum(bool(r) and r[0] != DAY_QUESTION for r in answered),
              "unexpected_sends": sum(len(v) for to, v in by_to.items() if to not in {wa_id(c) for c in ids})}
    checks["ok"] = checks["replied_once"] == k and not (checks["wrong_text"] or checks["unexpected_sends"])
    per = max(measured_turns, 1)
    out: dict[str, Any] = {
        "turns": k, "warm_up": warm, "measured": measured_turns, "first_questions": first_sent,
        "first_steps": first_steps, "replies_sent_by_scheduler": left, "checks": checks,
        "cpu_ms_per_turn": round(1000 * sum(cpu.values()) / per, 2),
        "wall_ms_per_turn": round(1000 * sum(wall.values()) / per, 2),
        "statements_per_turn": round(sum(sum(c.values()) for c in statements.values()) / per, 2),
        "transactions_per_turn": round(sum(commits.values()) / per, 2),
        "by_stage": {name: {"cpu_ms": round(1000 * cpu[name] / per, 2), "wall_ms": round(1000 * wall[name] / per, 2),
                            "statements": round(sum(statements[name].values()) / per, 2),
                            "by_verb": {v: round(c / per, 2) for v, c in sorted(statements[name].items())},
                            "transactions": round(commits[name] / per, 2)} for name in STAGES},
        "profiled": profiler is not None,
    }
    if profiler is not None:
        path = logdir / "inline-turns.prof"
        profiler.dump_stats(path)
        out["profile"] = profile_summary(profiler)
        out["profile"]["file"] = str(path)
    return out


def inline_advances(args: argparse.Namespace, db: Database, conninfo: str, database_url: str, secret_keys: str,
                    clinic: dict[str, Any]) -> dict[str, Any]:
    """A plain wait → end advance measured beside the turns, in the same database and run, by
    bench/flows.py's own inline measurement (its flow, published in this org)."""
    with db.begin() as conn:
        pointer_id = versions.create_flow(conn, clinic["org_id"], name="Retorno (bench)", draft_graph=wait_graph(False),
                                          trigger_config={"kind": "manual"})
        version = versions.publish(conn, clinic["org_id"], pointer_id)
    # run_inline advances its first claim (ADVANCE_WARM_UP) to warm up, outside the counts.
    flow_args = argparse.Namespace(enrollments=args.contacts + args.inline, inline=args.inline + ADVANCE_WARM_UP,
                                   send_batch=str(ADVANCE_WARM_UP),
                                   inline_profile=False, inline_profile_out=None, with_send=False)
    return run_inline(flow_args, conninfo, database_url, secret_keys,
                      {"org_id": clinic["org_id"], "pointer_id": pointer_id, "version_id": int(version.id)})


def _with_processes(args: argparse.Namespace, conninfo: str, database_url: str, secret_keys: str,
                    clinic: dict[str, Any], fake: FakeProcess, logdir: Path, report: dict[str, Any]) -> bool:
    redis.Redis.from_url(args.redis).flushdb()
    env_args = argparse.Namespace(redis=args.redis, dispatch_interval=args.dispatch_interval, populate_interval="3600",
                                  provider="http-fake", send_batch=None, claim_batch=None, send_concurrency=None)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMBRA_", "DATABASE_URL", "BROKER_URL"))}
    env.update(engine_env(env_args, database_url, secret_keys))
    if args.consumer_idle_ms is not None:
        env["dramatiq_worker_timeout"] = str(args.consumer_idle_ms)  # read by dramatiq.worker at import
    children = Children(logdir, env)
    worker_args = ["worker", "--processes", str(args.workers)]
    if args.threads:
        worker_args += ["--threads", str(args.threads)]
    if args.conversation_threads:
        worker_args += ["--conversation-threads", str(args.conversation_threads)]
    port = free_port()
    sampler = Sampler(children.procs, args.db_name)
    try:
        children.start("worker", worker_args)
        ready_s = wait_for_workers(args.redis, args.workers, children, timeout=120)
        children.start("web", ["web", "--bind", f"127.0.0.1:{port}", "--workers", str(args.web_workers)])
        web_s = wait_for_web(port, children)
        children.start("scheduler", ["scheduler"])
        log(f"workers ready in {ready_s:.1f}s, web in {web_s:.1f}s; scheduler started "
            f"(dispatch interval {args.dispatch_interval}s); asking everyone the first question")
        first_s = _wait_first_questions(args, conninfo, fake, children)
        stats = fake.stats()
        report["setup"]["first_questions_s"] = round(first_s, 1)
        sample = stats["sample_body"]
        log(f"first question asked to {stats['sends']:,} contacts in {first_s:.1f}s")
        sampler.start()
        if args.bare_seconds > 0:
            report["bare"] = measure_bare(fake, sample, args.rate, args.bare_seconds, args.client_threads)
            log(f"bare limit: {report['bare']['latency_ms']}")
        fake.reset()
        sampler.mark()
        turns = _turns(args, port, clinic, fake)
        report["turns"] = turns
    finally:
        sampler.stop()
        children.stop_all()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        report["hops_ms"] = hops(conn, clinic["org_id"])
        report["database"] = db_checks(conn, clinic["org_id"])
    resources = sampler.summary()
    n = max(turns["turns"], 1)
    resources["cpu_ms_per_turn"] = {k: round(1000 * v / n, 1) for k, v in resources["cpu_seconds_by_group"].items()}
    report["resources"] = resources
    checks = turns["checks"]
    return not (checks["lost"] or checks["duplicated"] or checks["wrong_text"] or checks["unexpected_sends"]
                or turns["webhook_errors"])


def _wait_first_questions(args: argparse.Namespace, conninfo: str, fake: FakeProcess, children: Children) -> float:
    started = time.monotonic()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while True:
            time.sleep(0.5)
            waiting = conn.execute("SELECT count(*) FROM enrollments WHERE status = 'waiting_reply' "
                                   "AND current_node_id = %s", (ASK_NODE,)).fetchone()[0]
            open_messages = conn.execute("SELECT count(*) FROM messages WHERE status IN "
                                         "('new', 'pending', 'claimed', 'sending')").fetchone()[0]
            if waiting == args.contacts and open_messages == 0 and fake.sends() >= args.contacts:
                return time.monotonic() - started
            dead = {k: v for k, v in children.alive().items() if v is not None}
            if dead:
                raise SystemExit(f"a process exited during the setup: {dead}; see {children.logdir}")
            if time.monotonic() - started > 300:
                raise SystemExit(f"setup timed out: {waiting} waiting, {open_messages} open; see {children.logdir}")


def _turns(args: argparse.Namespace, port: int, clinic: dict[str, Any], fake: FakeProcess) -> dict[str, Any]:
    """Post the turns at the rate, wait for the replies, and match each to its turn at the fake."""
    count = int(args.rate * args.duration)
    pool = urllib3.HTTPConnectionPool("127.0.0.1", port, maxsize=args.client_threads, block=False, retries=False,
                                      timeout=urllib3.Timeout(connect=5, read=30))
    path = f"/webhooks/meta/{clinic['channel_id']}"
    secret = clinic["app_secret"].encode()
    sent_at: list[float] = [0.0] * count
    accepted_at: list[float | None] = [None] * count
    statuses: dict[int, int] = defaultdict(int)
    lock = threading.Lock()

    def post(i: int) -> None:
        contact_id = i + 1
        raw = inbound_body(contact_id, f"wamid.bench-turn-{contact_id}", REPLIES[i % len(REPLIES)])
        headers = {"Content-Type": "application/json",
                   "X-Hub-Signature-256": "sha256=" + hmac.new(secret, raw, hashlib.sha256).hexdigest()}
        sent_at[i] = time.monotonic()
        try:
            response = pool.urlopen("POST", path, body=raw, headers=headers)
            status = response.status
        except (urllib3.exceptions.HTTPError, OSError):
            status = 0
        if status == 200:
            accepted_at[i] = time.monotonic()
        with lock:
            statuses[status] += 1

    log(f"turns: {count:,} at {args.rate:g}/s for {args.duration:g}s")
    t0 = time.monotonic()
    lag = paced(args.rate, count, post, args.client_threads)
    posted_s = time.monotonic() - t0
    deadline = time.monotonic() + args.drain
    while time.monotonic() < deadline and fake.sends() < count:
        time.sleep(0.2)
    time.sleep(DUPLICATE_WATCH_S)
    arrivals = fake_arrivals(fake)
    by_to: dict[str, list[tuple[float, str | None]]] = defaultdict(list)
    for t, to, _ref, text in arrivals:
        by_to[to].append((t, text))
    latencies: list[float] = []
    accept: list[float] = []
    lost = duplicated = wrong_text = 0
    turned = set()
    for i in range(count):
        to = wa_id(i + 1)
        turned.add(to)
        replies = by_to.get(to, [])
        if accepted_at[i] is not None:
            accept.append(accepted_at[i] - sent_at[i])  # type: ignore[operator]
        if not replies:
            lost += 1
            continue
        duplicated += len(replies) > 1
        wrong_text += replies[0][1] != DAY_QUESTION
        if accepted_at[i] is not None:
            latencies.append(replies[0][0] - accepted_at[i])  # type: ignore[operator]
    unexpected = sum(len(v) for to, v in by_to.items() if to not in turned)
    log(f"turn latency: {percentiles(latencies)}; lost {lost}, duplicated {duplicated}, wrong text {wrong_text}")
    return {"turns": count, "posted_s": round(posted_s, 1), "generator_max_lag_ms": round(1000 * lag, 1),
            "webhook_statuses": dict(statuses), "webhook_errors": count - statuses.get(200, 0),
            "webhook_answer_ms": percentiles(accept), "latency_ms": percentiles(latencies),
            "under_500ms_pct": round(100 * sum(x <= 0.5 for x in latencies) / max(len(latencies), 1), 2),
            "fake_sends": len(arrivals),
            "checks": {"replied_once": count - lost - duplicated, "lost": lost, "duplicated": duplicated,
                       "wrong_text": wrong_text, "unexpected_sends": unexpected}}


def hops(conn: psycopg.Connection, org_id: int) -> dict[str, Any]:
    """Where a turn's time goes, from the engine's own timestamps (wall clock of the processes
    that wrote them): webhook stored → processed by a worker (`process_inbound`, broker hop) →
    the ask's step (scheduler pass claims it, `advance_enrollments`) → the question sent (scheduler
    pass claims it, `send_messages`, the provider call), the last split at the message's claim
    (queued → claimed by a scheduler pass → sent by a worker)."""
    rows = conn.execute(
        "SELECT extract(epoch FROM i.processed_at - i.received_at), extract(epoch FROM s.created_at - i.processed_at), "
        "extract(epoch FROM m.sent_at - s.created_at), extract(epoch FROM m.sent_at - i.received_at), "
        "extract(epoch FROM c.created_at - m.created_at), extract(epoch FROM m.sent_at - c.created_at) "
        "FROM inbound_messages i "
        "JOIN LATERAL (SELECT created_at FROM enrollment_events e WHERE e.org_id = i.org_id "
        "  AND e.enrollment_id = i.flow_enrollment_id AND e.event_type = 'step' AND e.node_id = %s "
        "  AND e.created_at >= i.received_at ORDER BY e.id LIMIT 1) s ON true "
        "JOIN LATERAL (SELECT id, created_at, sent_at FROM messages m WHERE m.org_id = i.org_id "
        "  AND m.enrollment_id = i.flow_enrollment_id AND m.created_at >= i.received_at "
        "  ORDER BY m.id LIMIT 1) m ON true "
        "JOIN LATERAL (SELECT created_at FROM message_events v WHERE v.org_id = i.org_id AND v.message_id = m.id "
        "  AND v.event = 'claimed' ORDER BY v.id LIMIT 1) c ON true "
        "WHERE i.org_id = %s AND i.provider_message_id LIKE 'wamid.bench-turn-%%' AND m.sent_at IS NOT NULL",
        (ASK_NODE, org_id)).fetchall()
    names = ("stored_to_processed", "processed_to_step", "step_to_sent", "stored_to_sent", "queued_to_claimed",
             "claimed_to_sent")
    return {name: percentiles([float(r[k]) for r in rows]) for k, name in enumerate(names)}


def db_checks(conn: psycopg.Connection, org_id: int) -> dict[str, Any]:
    """What the database says of the turns: steps by reason, enrollments by status, messages by status."""
    return {
        "turn_inbound_by_outcome": dict(conn.execute(
            "SELECT coalesce(outcome, 'unprocessed'), count(*) FROM inbound_messages WHERE org_id = %s "
            "AND provider_message_id LIKE 'wamid.bench-turn-%%' GROUP BY 1", (org_id,)).fetchall()),
        "ask_steps_by_reason": dict(conn.execute(
            "SELECT payload->>'reason', count(*) FROM enrollment_events WHERE org_id = %s AND event_type = 'step' "
            "AND node_id = %s GROUP BY 1", (org_id, ASK_NODE)).fetchall()),
        "enrollments_by_status": dict(conn.execute(
            "SELECT status, count(*) FROM enrollments WHERE org_id = %s GROUP BY 1", (org_id,)).fetchall()),
        "messages_by_status": dict(conn.execute(
            "SELECT status, count(*) FROM messages WHERE org_id = %s GROUP BY 1", (org_id,)).fetchall()),
        "periods_taken": conn.execute(
            "SELECT count(*) FROM enrollments WHERE org_id = %s AND data ? 'periodo'", (org_id,)).fetchone()[0],
    }


def _fmt(p: dict[str, Any]) -> str:
    return f"p50 {p['p50']} ms, p95 {p['p95']} ms, p99 {p['p99']} ms, max {p['max']} ms (n={p['n']})"


def _print_summary(report: dict[str, Any]) -> None:
    m, code, a = report["machine"], report.get("code", {}), report["args"]
    settings = m["postgresql_settings"]
    turns = report.get("turns")
    lines = ["", f"=== Lembra conversation turn latency (commit {code.get('commit')}"
             + (", engine files modified" if code.get("engine_dirty") else "") + ")",
             f"machine    {m['nproc']} CPU {m['cpu_model']}, {m['memory_gib']} GiB RAM, kernel {m['kernel']}, "
             f"load before {m['loadavg_before']}",
             f"software   Python {m['python']}, {m['postgresql']} (shared_buffers {settings.get('shared_buffers')}, "
             f"synchronous_commit {settings.get('synchronous_commit')}, autovacuum {settings.get('autovacuum')}), "
             f"Redis {m['redis']}"]
    if turns:
        lines += [f"setup      {report['setup']['contacts']:,} contacts at {report['setup']['flow']}; org reply debounce "
             f"{a['debounce']} s" + (" (the engine's default is 8 s)" if a["debounce"] != 8 else " (the default)")
             + f"; scheduler dispatch interval {a['dispatch_interval']} s; consumer idle poll up to "
             f"{a.get('consumer_idle_ms') or 1000} ms; lembra worker --processes {a['workers']}, "
             f"lembra web --workers {a['web_workers']}; built-in reader",
             f"turns      {turns['turns']:,} at {a['rate']:g}/s for {a['duration']:g} s (posted in "
             f"{turns['posted_s']} s, generator lag max {turns['generator_max_lag_ms']} ms); webhook answers "
             f"{turns['webhook_statuses']}",
             f"LATENCY    webhook 200 → reply at the fake: {_fmt(turns['latency_ms'])}; "
             f"{turns['under_500ms_pct']}% within 500 ms"]
        lines += _process_lines(report)
    lines += _inline_lines(report)
    print("\n".join(lines), flush=True)


def _process_lines(report: dict[str, Any]) -> list[str]:
    turns = report["turns"]
    lines = []
    bare = report.get("bare")
    if bare:
        lines.append(f"bare       the same round trip with no engine work (post → fake): {_fmt(bare['latency_ms'])}; "
                     f"errors {bare['errors']}")
    lines.append(f"webhook    its own answer (post → 200): {_fmt(turns['webhook_answer_ms'])}")
    h = report["hops_ms"]
    lines.append("hops       (engine timestamps) stored → processed " + _fmt(h["stored_to_processed"]))
    lines.append("           processed → ask step " + _fmt(h["processed_to_step"]))
    lines.append("           ask step → sent " + _fmt(h["step_to_sent"]))
    if "queued_to_claimed" in h:
        lines.append("           of which question queued → claimed " + _fmt(h["queued_to_claimed"]))
        lines.append("           and claimed → sent " + _fmt(h["claimed_to_sent"]))
    c = turns["checks"]
    lines.append(f"checks     replied exactly once {c['replied_once']:,}/{turns['turns']:,}, lost {c['lost']}, "
                 f"twice {c['duplicated']}, wrong question {c['wrong_text']}, other sends {c['unexpected_sends']}; "
                 f"fake sends {turns['fake_sends']:,}")
    d = report["database"]
    lines.append(f"database   turn inbound {d['turn_inbound_by_outcome']}, ask steps {d['ask_steps_by_reason']}, "
                 f"enrollments {d['enrollments_by_status']}, messages {d['messages_by_status']}")
    res = report["resources"]
    lines.append(f"CPU        machine {res['machine_cpu_busy_pct']}% busy; per turn: "
                 + ", ".join(f"{k} {v} ms" for k, v in sorted(res["cpu_ms_per_turn"].items()))
                 + f"; everything else on the machine {res['other_cpu_s']} s (other jobs: interference)")
    return lines


def _inline_lines(report: dict[str, Any]) -> list[str]:
    inline, advance = report.get("inline"), report.get("advance")
    if not inline:
        return []
    c = inline["checks"]
    lines = [f"inline     {inline['measured']:,} turns one at a time in this process (after {inline['warm_up']} to warm "
             f"up; {'under cProfile: CPU inflated' if inline['profiled'] else 'not profiled'}): "
             f"{inline['cpu_ms_per_turn']} ms CPU, {inline['wall_ms_per_turn']} ms wall, "
             f"{inline['statements_per_turn']} statements and {inline['transactions_per_turn']} transactions per turn; "
             f"replied exactly once {c['replied_once']:,}/{inline['turns']:,}, lost {c['lost']}, twice "
             f"{c['duplicated']}, wrong question {c['wrong_text']}, other sends {c['unexpected_sends']}; "
             f"replies left to a scheduler pass {inline.get('replies_sent_by_scheduler', 0)}"]
    for name, st in inline["by_stage"].items():
        lines.append(f"           {name}: {st['cpu_ms']} ms CPU, {st['wall_ms']} ms wall, {st['statements']} statements "
                     f"{st['by_verb']}, {st['transactions']} transactions")
    if advance:
        lines.append(f"advance    beside it, a wait → end advance (bench/flows.py's inline, claims of "
                     f"{advance['claim_batch']}, {advance['measured']:,} measured): "
                     f"{advance['advance_cpu_ms_per_enrollment']} ms CPU, "
                     f"{advance['advance_statements_per_enrollment']} statements "
                     f"{advance['advance_statements_by_verb_per_enrollment']}, "
                     f"{advance['advance_transactions_committed_per_enrollment']} transactions per advance; "
                     f"a turn costs {round(inline['cpu_ms_per_turn'] / max(advance['advance_cpu_ms_per_enrollment'], 1e-9), 1)}"
                     " advances' CPU")
    if "profile" in inline:
        prof = inline["profile"]
        lines.append("           cProfile self time by library: "
                     + ", ".join(f"{k} {v}%" for k, v in prof["self_by_library_pct"]))
        lines.append("           top inclusive: " + "; ".join(f"{k} {v}s" for k, v in prof["top_inclusive_s"][:12]))
        lines.append(f"           profile: {prof['file']}")
    return lines




if __name__ == "__main__":
    sys.exit(main())
