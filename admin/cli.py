"""The `lembra` command line. Every setting comes from the environment (see `lembra --help`)."""

from __future__ import annotations

import errno
import os
import sys
from datetime import datetime
from typing import Any, Callable

import click
from sqlalchemy import func, select

from engine.core.config import ENV_VARS, ConfigError, Settings
from engine.fleet.worker_pools import CONVERSATION_THREADS, SEND_THREADS

EXIT_CONFIG = 2


def _env_help() -> str:
    lines = ["\b", "Environment variables:"]
    for name, (default, meaning) in ENV_VARS.items():
        shown = f" (default {default})" if default else ""
        lines.append(f"  {name}: {meaning}{shown}")
    return "\n".join(lines)


def fail(message: str) -> None:
    """Print a one-line error and exit with status 2."""
    click.echo(f"lembra: error: {message}", err=True)
    sys.exit(EXIT_CONFIG)


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable


def _runtime(*, check_broker: bool = False, migrate: bool = False) -> Any:
    """Settings → checked database (and broker) → runtime, or a one-line error."""
    from engine.store.app_role import warn_if_row_security_is_off
    from engine.fleet.broker import check_broker as broker_check
    from engine.store.db import Database
    from engine.core.logs import configure
    from engine.store.migrate import upgrade_database
    from engine.store.runtime import Runtime

    settings = _settings()
    configure(settings.log_level, settings.log_format)
    try:
        if check_broker:
            broker_check(settings)
        if not migrate:
            _refuse_to_create_a_database(settings.database_url)
        database = Database(settings.database_url)
        database.check()
        if not migrate and not database.has_schema():
            fail("the database has no Lembra tables yet: run `lembra db upgrade` (or `lembra up`) first")
        if check_broker:  # the long-running commands (up, web, worker, scheduler): said once, at start
            warn_if_row_security_is_off(database.engine)
        database.dispose()
        if migrate:
            upgrade_database(settings)
        return Runtime.build(settings)
    except ConfigError as exc:
        fail(str(exc))


def _refuse_to_create_a_database(database_url: str) -> None:
    """Only `lembra up` and `lembra db upgrade` may start a new SQLite file: a command run in the
    wrong folder would otherwise leave an empty lembra.db (and a key) behind and fail on it."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    if not os.path.exists(url.database) and os.path.isdir(os.path.dirname(os.path.abspath(url.database))):
        fail(f"no Lembra database at {os.path.abspath(url.database)}: run this in the folder where you ran "
             "`lembra up`, or set DATABASE_URL")


def _domain(action: Callable[[], Any]) -> Any:
    """Run a domain action, turning its validation errors into one-line CLI errors."""
    from engine.core.errors import DomainError

    try:
        return action()
    except DomainError as exc:
        fail(str(exc))


@click.group(help="Lembra: reminders and follow-ups for clinics.\n\n" + _env_help())
@click.version_option(package_name="lembra")
def main() -> None:
    """The `lembra` command."""


@main.command(help="Run everything in one process: web console, scheduler and workers. With no "
                   "configuration this is the embedded default (SQLite, in-process broker, sandbox, demo clinic).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--demo/--no-demo", default=True, show_default=True, help="Seed the demo clinic on first start.")
@click.option("--threads", default=4, show_default=True, type=click.IntRange(min=1),
              help="Worker threads for sends, and as many for replies and follow-up steps.")
def up(host: str, port: int, demo: bool, threads: int) -> None:
    from admin.embedded import Embedded
    from engine.fleet import demo as demo_seed

    rt = _runtime(check_broker=True, migrate=True)
    if demo:
        with rt.db.begin() as conn:
            seeded = demo_seed.seed(conn, rt.keyring)
        if seeded.created:
            click.echo("Demo clinic created.")
        click.echo(f"Sign in as {seeded.owner_email} / {seeded.owner_password}")
    embedded = Embedded(rt, worker_threads=threads)
    try:
        server = embedded.listen(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            fail(f"port {port} is already in use on {host}: pick another with `lembra up --port 8080`")
        fail(f"cannot listen on {host}:{port} ({exc.strerror or type(exc).__name__})")
    click.echo(f"Lembra is running on http://{host}:{port}/  (Ctrl+C to stop)")
    embedded.serve(server)


@main.command(help="Run the web console and webhooks under gunicorn.")
@click.option("--bind", default="0.0.0.0:8000", show_default=True)
@click.option("--workers", default=2, show_default=True, type=int)
def web(bind: str, workers: int) -> None:
    from gunicorn.app.base import BaseApplication

    from engine.core import metrics

    metrics.use_multiprocess("web")  # before prometheus_client is imported: /metrics adds up every gunicorn worker
    rt = _runtime(check_broker=True)
    rt.close()

    class _App(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            self.cfg.set("bind", bind)
            self.cfg.set("workers", workers)
            self.cfg.set("threads", 4)
            self.cfg.set("accesslog", None)

        def load(self) -> Any:
            from admin.wsgi import app

            return app

    _App().run()


@main.command(help="Run Dramatiq worker processes (any number, on any machine). A worker process "
                   "that dies is replaced (with a backoff) while the others keep working; SIGTERM or "
                   "Ctrl+C stops them gracefully. Exits 1 if one keeps dying at start.")
@click.option("--processes", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", default=SEND_THREADS, show_default=True, type=click.IntRange(min=1),
              help="Threads per process taking send tasks (each task's provider calls run in parallel).")
@click.option("--conversation-threads", default=CONVERSATION_THREADS, show_default=True, type=click.IntRange(min=1),
              help="Threads per process taking patient replies and follow-up steps, apart from the sends.")
@click.option("--shutdown-timeout", default=600, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a graceful stop waits for the messages being worked on.")
def worker(processes: int, threads: int, conversation_threads: int, shutdown_timeout: float) -> None:
    settings = _settings()
    if settings.broker_kind == "stub":
        fail("lembra worker needs BROKER_URL (redis:// or amqp://); the embedded default runs workers in `lembra up`")
    _runtime(check_broker=True).close()
    # The supervisor (engine/fleet/supervisor.py) replaces this process, so what stays is small.
    child = [sys.executable, "-m", "engine.fleet.worker_process", "--threads", str(threads),
             "--conversation-threads", str(conversation_threads), "--shutdown-timeout", str(shutdown_timeout)]
    os.execv(sys.executable, [sys.executable, "-m", "engine.fleet.supervisor", "--processes", str(processes), "--", *child])


@main.command(help="Run the scheduler (populate, claim, dispatch). Safe to run twice: on PostgreSQL "
                   "only one is active. With the in-process broker it also runs the workers.")
@click.option("--once", is_flag=True, help="One populate + dispatch pass, then exit.")
def scheduler(once: bool) -> None:
    import threading

    from admin.embedded import Embedded
    from engine.core import metrics
    from engine.fleet.broker import setup_broker
    from engine.store.runtime import install
    from engine.fleet.scheduler import Scheduler

    rt = _runtime(check_broker=True)
    metrics.serve("scheduler", enabled=not once)  # /metrics and /healthz on LEMBRA_SCHEDULER_METRICS_PORT
    if rt.settings.broker_kind == "stub":
        embedded = Embedded(rt)
        if once:
            embedded.start_workers()
            tick = embedded.scheduler.tick(force_populate=True)
            embedded.drain()
            embedded.stop_workers()
            click.echo(f"claimed {tick.claimed} message(s)")
            return
        embedded.start()
        try:
            embedded.stop_event.wait()
        except KeyboardInterrupt:
            embedded.stop()
        return
    install(rt)
    setup_broker(rt.settings)
    import engine.fleet.actors as actors

    sched = Scheduler(rt, lambda ids: actors.send_messages.send(list(ids)),
                      lambda pairs: actors.advance_enrollments.send([list(p) for p in pairs]),
                      lambda ids: actors.process_inbound.send(list(ids)))
    if once:
        tick = sched.tick(force_populate=True)
        click.echo(f"claimed {tick.claimed} message(s)")
        return
    stop = threading.Event()
    try:
        sched.run(stop)
    except KeyboardInterrupt:
        stop.set()


@main.group(help="Database schema.")
def db() -> None:
    """Database commands."""


@db.command(help="Apply pending migrations (a no-op when the schema is current). On PostgreSQL, with "
                  "LEMBRA_OWNER_DATABASE_URL set, they run as that owner, and DATABASE_URL's role (the one web, "
                  "workers and scheduler use) is created if missing, with no superuser nor BYPASSRLS, and granted "
                  "the tables.")
def upgrade() -> None:
    from engine.words.catalogue import describe
    from engine.store.migrate import upgrade_database

    settings = _settings()
    try:
        done = upgrade_database(settings)
    except ConfigError as exc:
        fail(str(exc))
    click.echo("applied: " + ", ".join(done.applied) if done.applied else "schema is up to date")
    if done.app_role is not None and done.row_security_off is None:
        click.echo(str(describe("app_role_created" if done.app_role.created else "app_role_granted",
                                role=done.app_role.name)))
    if done.row_security_off is not None:
        click.echo(str(describe("row_security_bypassed", role=done.row_security_off)), err=True)


@main.group(help="The demo clinic.")
def demo() -> None:
    """Demo commands."""


@demo.command(help="Create the demo clinic (no-op if it exists).")
def seed() -> None:
    from engine.fleet import demo as demo_seed

    rt = _runtime(migrate=True)
    with rt.db.begin() as conn:
        result = demo_seed.seed(conn, rt.keyring)
    click.echo(("created" if result.created else "already there") + f": org id {result.org_id}")


@main.group(help="Tenants.")
def orgs() -> None:
    """Org commands."""


@orgs.command("create", help="Create an org.")
@click.option("--slug", required=True)
@click.option("--name", required=True)
@click.option("--timezone", default="America/Sao_Paulo", show_default=True)
@click.option("--state", default=None, help="Brazilian state (UF) for state holidays, e.g. SP.")
def orgs_create(slug: str, name: str, timezone: str, state: str | None) -> None:
    from engine.tenants.orgs import create_org

    rt = _runtime()
    with rt.db.begin() as conn:
        org_id = _domain(lambda: create_org(conn, slug=slug, name=name, timezone=timezone, state=state))
    click.echo(str(org_id))


@main.group(help="Console users.")
def users() -> None:
    """User commands."""


@users.command("create", help="Create a console user (prompts for the password when not given).")
@click.option("--org", "org_slug", required=True)
@click.option("--email", required=True)
@click.option("--role", type=click.Choice(["owner", "manager", "agent"]), required=True)
@click.option("--password", default=None)
def users_create(org_slug: str, email: str, role: str, password: str | None) -> None:
    from engine.tenants.orgs import create_user, org_by_slug

    if password is None:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    rt = _runtime()
    with rt.db.begin() as conn:
        org = _domain(lambda: org_by_slug(conn, org_slug))
        user_id = _domain(lambda: create_user(conn, org_id=org.id, email=email, role=role, password=password))
    click.echo(str(user_id))


@main.command(help="Show the queue (no message bodies, no phone numbers). STATUS and REASON are in words; "
                   "--codes prints the raw codes instead, for scripts.")
@click.option("--status", default=None, help="Only this status (one of the codes --codes prints).")
@click.option("--org", "org_slug", default=None)
@click.option("--limit", default=50, show_default=True, type=int)
@click.option("--codes", is_flag=True, help="Print status and reason as codes, not sentences.")
def messages(status: str | None, org_slug: str | None, limit: int, codes: bool) -> None:
    from engine.store.models import MESSAGE_STATUSES
    from engine.store.models import messages as messages_table
    from engine.store.models import orgs as orgs_table
    from engine.tenants.orgs import org_by_slug

    if status is not None and status not in MESSAGE_STATUSES:
        fail(f"status must be one of {', '.join(MESSAGE_STATUSES)}")
    rt = _runtime()
    m = messages_table
    with rt.db.connect() as conn:
        query = select(m.c.id, orgs_table.c.slug, m.c.purpose, m.c.channel_kind, m.c.status, m.c.due_at,
                       m.c.attempts, m.c.error_code, m.c.skip_reason).join(orgs_table, orgs_table.c.id == m.c.org_id)
        counts = select(m.c.status, func.count()).group_by(m.c.status)
        if org_slug:
            org = _domain(lambda: org_by_slug(conn, org_slug))
            query = query.where(m.c.org_id == org.id)
            counts = counts.where(m.c.org_id == org.id)
        if status:
            query = query.where(m.c.status == status)
        rows = conn.execute(query.order_by(m.c.id.desc()).limit(limit)).all()
        totals = conn.execute(counts).all()
    width = 10 if codes else 34  # the longest status label
    header = (f"{'ID':>7}  {'ORG':<12} {'PURPOSE':<22} {'KIND':<8} {'STATUS':<{width}} {'DUE (UTC)':<17} "
              f"{'TRY':>3}  REASON")
    click.echo(header)
    for r in rows:
        due = r.due_at.strftime("%Y-%m-%d %H:%M") if isinstance(r.due_at, datetime) else "-"
        shown_status, reason = _message_words(r, codes)
        click.echo(f"{r.id:>7}  {r.slug[:12]:<12} {r.purpose[:22]:<22} {r.channel_kind:<8} {shown_status:<{width}} "
                   f"{due:<17} {r.attempts:>3}  {reason}")
    click.echo("totals: " + (", ".join(f"{s}={n}" for s, n in sorted(totals)) or "empty"))


def _message_words(row: Any, codes: bool) -> tuple[str, str]:
    """A queue row's status and reason: the catalogue's pt-BR words, or the raw codes."""
    from engine.words.reasons import row_reason, status_label

    if codes:
        return row.status, row.error_code or row.skip_reason or ""
    reason = row_reason(row.error_code, row.skip_reason, kind=row.channel_kind)
    return str(status_label(row.status)), str(reason) if reason is not None else ""


@main.group(help="Provider accounts (channels).")
def channels() -> None:
    """Channel commands."""


def _parse_settings(pairs: tuple[str, ...]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"--set takes key=value, got a value without '=' for {key.strip() or '?'}")
        values[key.strip()] = value
    return values


@channels.command("add", help="Add a channel. Credentials come from --set key=value or, one key=value per "
                              "line, from standard input (so they stay out of shell history); never echoed. "
                              "Prints the new channel id on its last line.")
@click.option("--org", "org_slug", required=True)
@click.option("--kind", type=click.Choice(["whatsapp", "email", "sms"]), required=True)
@click.option("--provider", required=True)
@click.option("--name", required=True)
@click.option("--set", "pairs", multiple=True, metavar="KEY=VALUE")
@click.option("--default/--no-default", "is_default", default=True, show_default=True)
@click.option("--min-interval-ms", type=int, default=None, help="Pacing: minimum gap between two sends.")
@click.option("--daily-cap", type=int, default=None, help="Pacing: sends per day at most.")
def channels_add(org_slug: str, kind: str, provider: str, name: str, pairs: tuple[str, ...], is_default: bool,
                 min_interval_ms: int | None, daily_cap: int | None) -> None:
    from engine.tenants.channels import create_channel
    from engine.tenants.orgs import org_by_slug

    credentials = _parse_settings(pairs)
    stdin = click.get_text_stream("stdin")
    if not pairs and not stdin.isatty():
        credentials = _parse_settings(tuple(line.strip() for line in stdin if line.strip()))
    rt = _runtime()
    with rt.db.begin() as conn:
        org = _domain(lambda: org_by_slug(conn, org_slug))
        channel_id = _domain(lambda: create_channel(
            conn, rt.keyring, org_id=org.id, kind=kind, provider=provider, name=name, credentials=credentials,
            is_default=is_default, min_interval_ms=min_interval_ms, daily_cap=daily_cap))
    click.echo(f"webhook URL: {rt.settings.public_url}/webhooks/{provider}/{channel_id}")
    if provider == "evolution":
        # Evolution is told where to call (with the JWT key); other providers are set in their consoles.
        from engine.store.models import channels as channels_table
        from gateway.errors import ProviderError

        with rt.db.connect() as conn:
            row = conn.execute(select(channels_table).where(channels_table.c.id == channel_id)).one()
        try:
            rt.providers.get(row).configure_webhook()
            click.echo("webhook configured on the Evolution instance")
        except ProviderError as exc:
            click.echo(f"warning: could not configure the Evolution webhook ({exc.code}); "
                       "run `lembra channels add` again or set it in Evolution", err=True)
    click.echo(str(channel_id))


@channels.command("list", help="List an org's channels (never a secret: only which keys are set).")
@click.option("--org", "org_slug", required=True)
def channels_list(org_slug: str) -> None:
    from engine.store.models import channels as channels_table
    from engine.tenants.orgs import org_by_slug

    rt = _runtime()
    with rt.db.connect() as conn:
        org = _domain(lambda: org_by_slug(conn, org_slug))
        rows = conn.execute(select(channels_table).where(channels_table.c.org_id == org.id)
                            .order_by(channels_table.c.id)).all()
    click.echo(f"{'ID':>5}  {'KIND':<8} {'PROVIDER':<9} {'STATUS':<8} {'DEFAULT':<7} {'PACING':<14} NAME / KEYS SET")
    for row in rows:
        keys_set = sorted(rt.keyring.open(row.credentials, key_version=row.key_version, table="channels",
                                          org_id=row.org_id, row_id=row.id)) if row.credentials else []
        pacing = f"{row.min_interval_ms or 0}ms/{row.daily_cap or '-'}" if (row.min_interval_ms or row.daily_cap) else "-"
        click.echo(f"{row.id:>5}  {row.kind:<8} {row.provider:<9} {row.status:<8} {'yes' if row.is_default else '':<7} "
                   f"{pacing:<14} {row.name} [{', '.join(keys_set)}]")


@channels.command("test", help="Send one message now through a channel and print the provider's message id. "
                               "Exit status: 0 sent, 2 permanent failure, 3 transient failure.")
@click.argument("channel_id", type=int)
@click.option("--to", "to", required=True, help="Phone number (E.164 or national) or e-mail address.")
@click.option("--text", default="Mensagem de teste do Lembra.", show_default=True)
def channels_test(channel_id: int, to: str, text: str) -> None:
    from engine.store.models import channels as channels_table
    from gateway.contract import OutboundMessage
    from gateway.errors import ProviderError
    from gateway.phones import InvalidPhone, normalize_phone

    rt = _runtime()
    with rt.db.connect() as conn:
        channel = conn.execute(select(channels_table).where(channels_table.c.id == channel_id)).first()
    if channel is None:
        fail(f"no channel {channel_id}")
    if channel.kind != "email":
        try:
            to = normalize_phone(to)
        except InvalidPhone:
            fail("--to is not a valid phone number")
    message = OutboundMessage(to=to, text=text, subject="Teste do Lembra" if channel.kind == "email" else None,
                              idempotency_key=f"channel-test:{channel_id}:{os.urandom(6).hex()}",
                              conversation_open=True)
    try:
        result = rt.providers.get(channel).send(message)
    except ProviderError as exc:
        kind = "permanent" if exc.permanent else "transient"
        click.echo(f"{kind} failure: {exc.reason} (code {exc.code})", err=True)
        sys.exit(2 if exc.permanent else 3)
    click.echo(result.provider_message_id)


@main.group(help="Credential keys.")
def keys() -> None:
    """Key commands."""


@keys.command("rotate", help="Re-encrypt every stored credential with the newest key in LEMBRA_SECRET_KEYS; "
                            "older keys can be removed afterwards.")
@click.option("--batch", default=200, show_default=True, type=int)
def keys_rotate(batch: int) -> None:
    from engine.store.key_rotation import rotate
    from gateway.crypto import CryptoError

    rt = _runtime()
    try:
        result = rotate(rt.db, rt.keyring, batch=batch)
    except CryptoError as exc:
        fail(f"{exc}: keep the old key in LEMBRA_SECRET_KEYS until rotation has finished")
    for table, count in result.rotated.items():
        click.echo(f"{table}: {count} re-encrypted with key version {rt.keyring.current_version}")


@keys.command("generate", help="Print a new key entry for LEMBRA_SECRET_KEYS.")
@click.option("--version", "version", default=1, show_default=True, type=int)
def keys_generate(version: int) -> None:
    from gateway.crypto import Keyring

    click.echo(Keyring.generate_spec(version))


@main.group(help="REST API keys (one org each; shown once, stored hashed).")
def apikeys() -> None:
    """API key commands."""


@apikeys.command("create", help="Create an API key for an org. The key is printed once, on the last line; "
                                "only its hash is stored.")
@click.option("--org", "org_slug", required=True)
@click.option("--name", required=True, help="What the key is for, e.g. the clinic's scheduling software.")
def apikeys_create(org_slug: str, name: str) -> None:
    from engine.tenants.apikeys import create_key
    from engine.tenants.orgs import org_by_slug

    rt = _runtime()
    with rt.db.begin() as conn:
        org = _domain(lambda: org_by_slug(conn, org_slug))
        new = _domain(lambda: create_key(conn, org_id=org.id, name=name))
    click.echo(f"API key {new.id} ({new.prefix}) for {org_slug}; store it now, it is not shown again:", err=True)
    click.echo(new.key)


@apikeys.command("revoke", help="Revoke one of an org's API keys by id.")
@click.option("--org", "org_slug", required=True)
@click.option("--id", "key_id", required=True, type=int)
def apikeys_revoke(org_slug: str, key_id: int) -> None:
    from engine.tenants.apikeys import revoke
    from engine.tenants.orgs import org_by_slug

    rt = _runtime()
    with rt.db.begin() as conn:
        org = _domain(lambda: org_by_slug(conn, org_slug))
        if not revoke(conn, org.id, key_id):
            fail(f"org {org_slug} has no live API key {key_id}")
    click.echo(f"revoked {key_id}")


@main.group(help="Follow-up flows (build them in the console or through the API).")
def flows() -> None:
    """Flow commands."""


def _flow_document(document: Any) -> tuple[Any, Any, Any]:
    """(graph, trigger_config, max_steps) of a flow file: a bare graph `{nodes, edges}`, or an
    object holding it as `graph` (or `draft_graph`, as `GET /flows/{id}` exports it) with the
    flow's `trigger_config` and `max_steps`. A bare graph is checked as a manual flow."""
    if isinstance(document, dict):
        for key in ("graph", "draft_graph"):
            if key in document:
                return document[key], document.get("trigger_config", {"kind": "manual"}), document.get("max_steps", 30)
    return document, {"kind": "manual"}, 30


@flows.command("validate", help="Check a flow file (JSON) against every publish rule, without a database. "
                                "Prints one line per issue (node: code — sentence). Exit status: 0 no issues, "
                                "1 issues, 2 a missing or unreadable file.")
@click.argument("file")
def flows_validate(file: str) -> None:
    import json
    from pathlib import Path

    from engine.flows.queries import sentence
    from engine.flows.validate import validate_for_publish

    try:
        document = json.loads(Path(file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        fail(f"{file} does not exist")
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(f"{file} is not UTF-8 text")
    except json.JSONDecodeError as exc:
        fail(f"{file} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})")
    except (ValueError, RecursionError):
        fail(f"{file} is not valid JSON")
    graph, trigger_config, max_steps = _flow_document(document)
    issues = validate_for_publish(graph, trigger_config=trigger_config, max_steps=max_steps, template_exists=None)
    if not issues:
        click.echo("ok")
        return
    for issue in issues:
        text = sentence(issue.code, issue.params)
        click.echo(f"{issue.node_id or '-'}: {issue.code} — {text if text is not None else issue.code}")
    sys.exit(1)


@flows.command("list", help="List an org's flows: status, active version and live enrollments.")
@click.option("--org", "org_slug", required=True)
def flows_list(org_slug: str) -> None:
    from engine.flows import queries
    from engine.store.models import flow_pointers
    from engine.tenants.orgs import org_by_slug

    rt = _runtime()
    with rt.db.connect() as conn:
        org = _domain(lambda: org_by_slug(conn, org_slug))
        rows = conn.execute(queries.flows_query(org.id).order_by(flow_pointers.c.id)).all()
        live = queries.live_counts(conn, org.id)
    click.echo(f"{'ID':>5}  {'STATUS':<9} {'VERSION':>7} {'LIVE':>6}  NAME")
    for row in rows:
        version = str(row.active_version) if row.active_version is not None else "-"
        click.echo(f"{row.id:>5}  {row.status:<9} {version:>7} {live.get(row.id, 0):>6}  {row.name}")


@flows.command("enroll", help="Start a flow for a contact by hand (its trigger and repeat policy do not apply). "
                              "Prints the enrollment id; exit status 1 with the reason when the engine refuses. "
                              "With --key, running it again answers the same enrollment.")
@click.argument("flow_id", type=int)
@click.option("--org", "org_slug", required=True)
@click.option("--contact", "contact_id", required=True, type=int, help="The contact's id.")
@click.option("--key", default=None, help="Your idempotency key for this enrollment.")
def flows_enroll(flow_id: int, org_slug: str, contact_id: int, key: str | None) -> None:
    from engine.flows import queries, triggers
    from engine.tenants.orgs import org_by_slug

    if key is not None and not key.strip():
        fail("--key must not be blank")
    rt = _runtime()
    with rt.db.begin() as conn:
        org = _domain(lambda: org_by_slug(conn, org_slug))
        result = triggers.enroll(conn, org.id, flow_id, contact_id, trigger_kind="manual",
                                 trigger_key=f"cli:{key}" if key else "cli", caller_key=f"cli:{key}" if key else None,
                                 automatic=False)
    if result.enrollment_id is None:
        text = queries.sentence(result.reason)
        click.echo(f"lembra: not enrolled: {text if text is not None else result.reason} ({result.reason})", err=True)
        sys.exit(1)
    if not result.created:
        click.echo(f"already enrolled with key {key}", err=True)
    click.echo(str(result.enrollment_id))


@main.command(help="Show an org's follow-up runs, newest first (codes and node ids only: no patient data).")
@click.option("--org", "org_slug", required=True)
@click.option("--status", default=None)
@click.option("--flow", "flow_id", default=None, type=int, help="Only this flow's runs.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
def enrollments(org_slug: str, status: str | None, flow_id: int | None, limit: int) -> None:
    from engine.flows import queries
    from engine.store.models import enrollments as enrollments_table
    from engine.tenants.orgs import org_by_slug

    if status is not None and status not in queries.ENROLLMENT_STATUSES:
        fail(f"status must be one of {', '.join(queries.ENROLLMENT_STATUSES)}")
    rt = _runtime()
    with rt.db.connect() as conn:
        org = _domain(lambda: org_by_slug(conn, org_slug))
        query = queries.enrollments_query(org.id, flow_id=flow_id, status=status)
        rows = conn.execute(query.order_by(enrollments_table.c.id.desc()).limit(limit)).all()
    click.echo(f"{'ID':>7}  {'FLOW':>5}  {'NODE':<20} {'STATUS':<14} {'NEXT (UTC)':<17} REASON")
    for r in rows:
        due = r.next_eval_at.strftime("%Y-%m-%d %H:%M") if isinstance(r.next_eval_at, datetime) else "-"
        click.echo(f"{r.id:>7}  {r.pointer_id:>5}  {r.current_node_id[:20]:<20} {r.status:<14} {due:<17} "
                   f"{queries.reason_code(r) or ''}")


from admin.cli_privacy import register as register_privacy  # noqa: E402
from admin.cli_templates import register as register_templates  # noqa: E402

register_privacy(main)
register_templates(main)


if __name__ == "__main__":
    main()
