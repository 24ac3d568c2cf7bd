"""Throughput benchmark: populate, then send N reminders through real worker processes.

    .venv/bin/python bench/throughput.py --appointments 100000 --workers 2
    .venv/bin/python bench/throughput.py --provider http-fake --appointments 50000 --workers 2
    .venv/bin/python bench/throughput.py --provider http-fake --appointments 20000 --scale 1,2,4
    .venv/bin/python bench/throughput.py --provider http-fake --rate 200 --duration 60
    .venv/bin/python bench/throughput.py --populate-only --appointments 1000000 --rules 2

What it does (see docs/benchmarks.md for the figures and how to read them):

1. creates a fresh PostgreSQL database (default `lembra_bench`), applies the migrations, creates
   `--orgs` clinics, each with a WhatsApp channel (credentials sealed with a keyring made for the
   run), `--rules` `before_start` rules (the first 120 minutes before), a 00:00-23:59 window with
   no Sunday or holiday skipping (so the result does not depend on when it runs), contacts with
   WhatsApp consent and N appointments, bulk-loaded with COPY. The channel is the sandbox
   (`--provider sandbox`, recorded in PostgreSQL) or a Meta channel (`--provider http-fake`)
   whose `base_url` is bench/http_fake.py: a separate loopback process that answers as Meta's
   Cloud API does and counts each `biz_opaque_callback_data` it receives;
2. times `engine.reminders.populate.populate` over all of them (and a second, no-op pass: the scheduler
   repeats it every LEMBRA_POPULATE_INTERVAL); with `--populate-only`, then the bare write
   (bench/bare_write.py): the same rows and events written again on their own, the limit of
   populate on this machine with this schema, then once per guarantee left out (each foreign key,
   each index, the idempotency key, the events at creation; `--bare-write-variants`): the account
   of what each costs, bracketed by a second full write;
3. starts `lembra worker --processes W --threads T` and one `lembra scheduler` against that
   database and Redis (`--redis`, FLUSHDB'd), waits until no message is open any more, and stops
   them (LEMBRA_PROVIDER_ALLOW=127.0.0.1 with the fake, so the egress guard lets loopback through);
4. samples the RSS (peak per process, and at 25/50/75/100 % of the drain) and CPU time of the
   workers, the scheduler, the fake, PostgreSQL and Redis while they run;
5. `--inline N` (default 1000): claims N more messages and sends them in this process through
   `engine.messaging.dispatch.send_batch` (when the engine has it) or `send_one` per id, with every SQL
   statement counted (an executemany counts as its parameter sets) and PostgreSQL's commits;
6. with the fake, the bare wire (bench/wire.py): plain `requests` from the same W processes, each
   with as many threads as it has provider calls in flight, posting the body Lembra posted, for
   `--wire-seconds`, once before the workers start (with the body of one reminder the engine
   renders and its provider posts in this process, which the fake then forgets) and once after
   the drain; Lembra's rate is printed as a fraction of their mean (the issue's goal: >= 60 %),
   since the machine's speed can change by a third between one minute and the next; then the
   same with plain urllib3, the client the engine's providers use, after the drain, as a second
   fraction;
7. prints messages/s, lateness (sent_at - due_at) percentiles computed in SQL, the duplicate /
   lost / unsent checks, statements and commits per message, RSS, CPU per message and share of
   the machine per component, and the machine; `--json FILE` also writes every figure as JSON.
   The exit status is 1 on any duplicate, lost or unsent message, or a timeout.

The reminders are due from `--lead` seconds after the data is loaded, spread evenly over
`--spread` seconds, so every message is due within a few seconds of the start of dispatch and
lateness measures how fast the backlog drains. `--rate R --duration D` instead makes R reminders
a second fall due for D seconds (R x D appointments), so lateness measures a steady pipeline.
`--scale 1,2,4` repeats the whole run (fresh database) per worker-process count and prints one
table row each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from engine.tenants.channels import create_channel  # noqa: E402
from engine.store.db import Database  # noqa: E402
from engine.core.logs import configure as configure_logs  # noqa: E402
from engine.store.migrate import upgrade  # noqa: E402
from engine.store.models import reminder_rule_kinds, reminder_rules  # noqa: E402
from engine.tenants.orgs import create_org  # noqa: E402
from engine.reminders.populate import PARALLEL_ORGS, populate, populate_changed  # noqa: E402
from engine.fleet.worker_pools import SEND_THREADS  # noqa: E402
from gateway.crypto import Keyring  # noqa: E402

UTC = timezone.utc
LEMBRA = str(Path(sys.executable).with_name("lembra"))
RULE_OFFSET_MINUTES = 120
HORIZON = timedelta(days=8)
#: Brazilian zones one hour apart: at any instant at least one of them is far from local midnight,
#: where a 00:00-23:59 window has its one-minute gap.
ZONES = ("America/Noronha", "America/Sao_Paulo", "America/Manaus", "America/Rio_Branco")
OPEN_STATUSES = ("new", "pending", "claimed", "sending")

FIRST_NAMES = ("Ana", "Bruno", "Carla", "Daniel", "Eduarda", "Felipe", "Gabriela", "Henrique", "Isabela",
               "João", "Larissa", "Marcos", "Natália", "Otávio", "Paula", "Rafael", "Sofia", "Tiago")
LAST_NAMES = ("Souza", "Lima", "Mendes", "Rocha", "Alves", "Costa", "Pereira", "Oliveira", "Santos",
              "Ferreira", "Ribeiro", "Carvalho", "Gomes", "Martins")
PROFESSIONALS = ("Dra. Beatriz Costa", "Dr. Caio Nunes", "Dra. Helena Prado", "Dr. Igor Barros")


def log(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# Machine
# ---------------------------------------------------------------------------------------------


def code_version() -> dict[str, Any]:
    """The commit measured, and whether the engine's files differ from it (others may be editing)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "--no-optional-locks", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    dirty = git("status", "--porcelain", "--", "engine", "gateway", "providers", "admin", "sql")
    return {"commit": git("rev-parse", "--short", "HEAD"), "engine_dirty": bool(dirty),
            "dirty_files": dirty.splitlines()[:20]}


def machine_info(conninfo: str, redis_url: str) -> dict[str, Any]:
    cpu_model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with psycopg.connect(conninfo, autocommit=True) as conn:
        pg_version = conn.execute("SELECT version()").fetchone()[0]
        pg_settings = dict(conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name IN "
            "('shared_buffers', 'synchronous_commit', 'fsync', 'max_connections', 'work_mem', 'autovacuum')"
        ).fetchall())
    redis_info = redis.Redis.from_url(redis_url).info("server")
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_model": cpu_model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": pg_version.split(" on ")[0],
        "postgresql_settings": pg_settings,
        "redis": redis_info.get("redis_version"),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------------------------
# Database and data
# ---------------------------------------------------------------------------------------------


def postgres_role(title: str, dbname: str) -> str | None:
    """Whose work a PostgreSQL process does, from its process title.

    `postgres: 15/main: USER DB HOST(PORT) STATE` is a client backend, `... autovacuum worker DB`
    an autovacuum worker: ours when DB is the benchmark's, else someone else's (None). The
    postmaster, checkpointer, background writer, WAL writer and launchers serve everyone; they
    are counted apart as "postgresql-shared"."""
    head, sep, rest = title.partition(": ")
    if not sep or not head.startswith("postgres"):
        return "postgresql-shared"  # the postmaster: /usr/lib/postgresql/15/bin/postgres -D …
    _cluster, sep, what = rest.partition(": ")
    words = (what if sep else rest).split()
    if len(words) >= 3 and words[0] == "autovacuum" and words[1] == "worker":
        return "postgresql" if words[2] == dbname else None
    if len(words) >= 3 and ("(" in words[2] or words[2] == "[local]"):  # a client backend
        return "postgresql" if words[1] == dbname else None
    return "postgresql-shared"


def backend_client_port(title: str) -> int | None:
    """The client's TCP port of a client backend (`… USER DB 127.0.0.1(54321) STATE`), else None."""
    for word in title.split():
        if word.endswith(")") and "(" in word:
            port = word[word.rindex("(") + 1:-1]
            return int(port) if port.isdigit() else None
    return None


def _title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def server_cpu_seconds(dbname: str) -> dict[int, float]:
    """CPU seconds so far of the PostgreSQL processes working for `dbname` (backends, autovacuum),
    by pid; other databases' backends (other people's jobs) are left out."""
    out = {}
    for proc in psutil.process_iter(["name"]):
        if (proc.info["name"] or "").startswith("postgres") and postgres_role(_title(proc), dbname) == "postgresql":
            try:
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            out[proc.pid] = times.user + times.system
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two snapshots (a process born in between counts from zero)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def cpu_meter(dbname: str) -> Callable[[], float]:
    """Start counting the CPU of `dbname`'s PostgreSQL processes; the returned function reads it."""
    before = server_cpu_seconds(dbname)
    return lambda: cpu_delta(before, server_cpu_seconds(dbname))


def create_database(server: str, name: str) -> None:
    with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(server: str, name: str) -> None:
    with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pick_timezone() -> str:
    now = datetime.now(UTC)
    for zone in ZONES:
        from zoneinfo import ZoneInfo

        if now.astimezone(ZoneInfo(zone)).hour not in (22, 23, 0):
            return zone
    return ZONES[1]  # unreachable: four consecutive offsets cannot all be near midnight


def rule_offsets(rules: int, populate_only: bool) -> list[int]:
    """Minutes before the start of each rule's reminder.

    The first rule is always 2 h before. For populate-only the second is 24 h before (the issue's
    1,000,000 x 2 rules; its reminders may fall anywhere in the horizon) and further ones a day
    more each. For a send run every reminder must fall due during the run, so rule k is
    120 - k minutes before: its reminders fall due k minutes after the first rule's."""
    if populate_only:
        return [RULE_OFFSET_MINUTES] + [1440 * k for k in range(1, rules)]
    return [RULE_OFFSET_MINUTES - k for k in range(rules)]


def fake_channel_credentials(index: int, fake_base_url: str) -> dict[str, str]:
    """A Meta channel's credentials (providers/meta/fields.py) pointing at the loopback fake."""
    return {"phone_number_id": f"10654035224{index:04d}", "access_token": f"EAAGbench{index:04d}" + "x" * 24,
            "app_secret": f"{index:032x}", "verify_token": f"bench-verify-token-{index:04d}",
            "base_url": fake_base_url}


def create_orgs(db: Database, keyring: Keyring, count: int, tz: str, realistic_window: bool,
                provider: str = "sandbox", fake_base_url: str | None = None,
                offsets: list[int] | None = None) -> list[int]:
    """Orgs through the engine's own functions: channel sealed with the keyring, one rule per offset.

    `provider` "sandbox" gives each org the in-process sandbox channel (as before); "http-fake" a
    Meta channel whose `base_url` is the loopback fake (bench/http_fake.py)."""
    org_ids = []
    offsets = offsets or [RULE_OFFSET_MINUTES]
    with db.begin() as conn:
        for index in range(count):
            if realistic_window:
                window: dict[str, Any] = {}  # the defaults: 08:00-20:00, no Sundays, no holidays
            else:
                window = dict(quiet_start="00:00", quiet_end="23:59", skip_sundays=False, skip_holidays=False)
            org_id = create_org(conn, slug=f"bench-{index:03d}", name=f"Clínica Bench {index}",
                                timezone=tz, state="SP", **window)
            if provider == "http-fake":
                assert fake_base_url is not None
                create_channel(conn, keyring, org_id=org_id, kind="whatsapp", provider="meta",
                               name="WhatsApp (Meta, loopback fake)",
                               credentials=fake_channel_credentials(index, fake_base_url), is_default=True)
            else:
                create_channel(conn, keyring, org_id=org_id, kind="whatsapp", provider="sandbox",
                               name="WhatsApp (sandbox)", credentials={"token": f"bench-{index}"}, is_default=True)
            now = datetime.now(UTC)
            for offset in offsets:
                rule_id = conn.execute(insert(reminder_rules).values(
                    org_id=org_id, name=f"Lembrete {offset} min antes", purpose="session_reminder",
                    template_key="session_reminder", trigger="before_start", offset_minutes=offset,
                    respect_window=True, active=True, created_at=now, updated_at=now,
                ).returning(reminder_rules.c.id)).scalar_one()
                conn.execute(insert(reminder_rule_kinds).values(org_id=org_id, rule_id=rule_id, kind="whatsapp",
                                                                position=0))
            org_ids.append(org_id)
    return org_ids


@dataclass
class LoadPlan:
    org_ids: list[int]
    appointments: int
    contacts_per_appointment: float
    tz: str
    #: (start of the due times, spread in seconds) for the throughput run, or None for populate-only
    due_from: datetime | None
    spread: float
    seed: int = 42

    def contacts(self) -> int:
        return max(len(self.org_ids), int(self.appointments * self.contacts_per_appointment))


def bulk_load(conninfo: str, plan: LoadPlan) -> dict[str, float]:
    """COPY contacts, their WhatsApp consent and the appointments; returns timings."""
    rng = random.Random(plan.seed)
    n_orgs = len(plan.org_ids)
    n_contacts = plan.contacts()
    now = datetime.now(UTC)
    timings: dict[str, float] = {}

    def contact_org(cid: int) -> int:  # contact ids are 1..n_contacts, dealt round-robin to orgs
        return plan.org_ids[(cid - 1) % n_orgs]

    with psycopg.connect(conninfo) as conn:
        started = time.perf_counter()
        with conn.cursor().copy(
            "COPY contacts (id, org_id, name, phone, email, created_at, updated_at) FROM STDIN"
        ) as copy:
            for cid in range(1, n_contacts + 1):
                first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
                copy.write_row((cid, contact_org(cid), f"{first} {last}", f"+55119{cid:08d}",
                                f"p{cid}@example.com", now, now))
        with conn.cursor().copy(
            "COPY preferences (org_id, contact_id, kind, opted_in, opted_in_at, source, evidence, updated_at) "
            "FROM STDIN"
        ) as copy:
            for cid in range(1, n_contacts + 1):
                copy.write_row((contact_org(cid), cid, "whatsapp", True, now, "import", "bench", now))
        # Due order is a shuffle of the ids so that due order, id order and org order differ.
        slots = list(range(plan.appointments))
        rng.shuffle(slots)
        with conn.cursor().copy(
            "COPY appointments (id, org_id, contact_id, professional, starts_at, timezone, mode, location, "
            "status, created_at, updated_at) FROM STDIN"
        ) as copy:
            for index in range(plan.appointments):
                aid = index + 1
                # A contact of the same org: contacts c ≡ org (mod n_orgs).
                org_pos = index % n_orgs
                if n_contacts >= plan.appointments:
                    cid = org_pos + 1 + n_orgs * (index // n_orgs)  # each appointment its own patient
                else:
                    per_org = (n_contacts - org_pos + n_orgs - 1) // n_orgs
                    cid = org_pos + 1 + n_orgs * rng.randrange(per_org)
                if plan.due_from is not None:
                    due = plan.due_from + timedelta(seconds=plan.spread * slots[index] / plan.appointments)
                    starts = due + timedelta(minutes=RULE_OFFSET_MINUTES)
                else:  # populate-only: spread over the next week, all inside the 8-day horizon
                    starts = now + timedelta(hours=3) + timedelta(seconds=rng.uniform(0, 7 * 86400))
                    starts = starts.replace(second=0, microsecond=0)
                online = rng.random() < 0.3
                copy.write_row((aid, plan.org_ids[org_pos], cid, rng.choice(PROFESSIONALS), starts, plan.tz,
                                "online" if online else "in_person",
                                "https://meet.example.com/s" if online else "Rua das Flores, 100 — sala 3",
                                "scheduled", now, now))
        for table in ("contacts", "preferences", "appointments"):
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
        conn.commit()
        timings["copy_s"] = time.perf_counter() - started
        started = time.perf_counter()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE contacts, preferences, appointments")
        timings["analyze_s"] = time.perf_counter() - started
    return timings


# ---------------------------------------------------------------------------------------------
# Processes, RSS and CPU
# ---------------------------------------------------------------------------------------------


@dataclass
class ProcStats:
    role: str
    peak_rss: int = 0
    rss: int = 0  # at the last sample: RSS checkpoints during the drain show whether it stays flat
    cpu_first: float | None = None
    cpu_last: float = 0.0

    @property
    def cpu_seconds(self) -> float:
        return 0.0 if self.cpu_first is None else self.cpu_last - self.cpu_first


class Sampler(threading.Thread):
    """Every `interval` s: RSS and CPU time of our children (and their children); every 4th pass
    also the CPU time of PostgreSQL and Redis server processes, and the whole machine's."""

    def __init__(self, roots: dict[str, subprocess.Popen[bytes]], dbname: str, interval: float = 0.5,
                 extra: dict[str, subprocess.Popen[bytes]] | None = None) -> None:
        super().__init__(daemon=True)
        self.roots = roots  # the live dict of Children.procs: the scheduler is added later
        self.extra = extra or {}  # processes not started through Children (the HTTP fake)
        self.me = psutil.Process()
        self.dbname = dbname
        self.pg_roles: dict[int, str | None] = {}
        #: pid of each of our PostgreSQL processes → whose work it does: the role of the process
        #: holding the backend's connection (worker, scheduler, bench), or autovacuum.
        self.pg_clients: dict[int, str] = {}
        self.interval = interval
        self.stop_event = threading.Event()
        self.stats: dict[int, ProcStats] = {}
        self.servers: dict[int, ProcStats] = {}
        self.machine_first = psutil.cpu_times()
        self.machine_last = self.machine_first
        self.started = time.monotonic()
        self.ended = self.started
        self.lock = threading.Lock()

    def _sample(self, proc: psutil.Process, role: str, into: dict[int, ProcStats], rss: bool = True) -> None:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                mem = proc.memory_info().rss if rss else 0
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return
        stat = into.setdefault(proc.pid, ProcStats(role))
        stat.role = role  # a worker parent is only known as one once its children exist
        cpu = times.user + times.system
        if stat.cpu_first is None:
            # A process first seen after the start counts from zero (it started during the run).
            stat.cpu_first = cpu if time.monotonic() - self.started < self.interval * 2 else 0.0
        stat.cpu_last = cpu
        stat.peak_rss = max(stat.peak_rss, mem)
        stat.rss = mem

    def sample_children(self) -> None:
        # This script too (polling, sampling): its CPU is neither the pipeline's nor other jobs'.
        self._sample(self.me, "bench", self.stats, rss=False)
        for name, popen in [*self.roots.items(), *self.extra.items()]:
            try:
                root = psutil.Process(popen.pid)
                children = root.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            self._sample(root, f"{name} (parent)" if children else name, self.stats)
            for index, child in enumerate(children, 1):
                self._sample(child, f"{name} #{index}", self.stats)

    def sample_servers(self) -> None:
        for proc in psutil.process_iter(["name"]):
            pname = proc.info["name"] or ""
            if pname.startswith("postgres"):
                if proc.pid not in self.pg_roles:  # a backend keeps its database for life
                    self.pg_roles[proc.pid] = postgres_role(_title(proc), self.dbname)
                role = self.pg_roles[proc.pid]
                if role is not None:
                    self._sample(proc, role, self.servers, rss=False)
                    if role == "postgresql" and proc.pid not in self.pg_clients:
                        self.pg_clients[proc.pid] = self._pg_client(proc)
            elif pname.startswith("redis-server"):
                self._sample(proc, "redis", self.servers, rss=False)
        self.machine_last = psutil.cpu_times()
        self.ended = time.monotonic()

    def _pg_client(self, proc: psutil.Process) -> str:
        """Whose work one of the benchmark database's PostgreSQL processes does."""
        title = _title(proc)
        if " autovacuum worker " in f" {title} ":
            return "autovacuum"
        port = backend_client_port(title)
        if port is None:
            return "other"
        for pid, stat in list(self.stats.items()):
            try:
                owner = psutil.Process(pid)
                # `net_connections` since psutil 6; `connections` before (pyproject allows 5.9).
                list_connections = getattr(owner, "net_connections", None) or owner.connections
                conns = list_connections(kind="tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if any(c.laddr and c.laddr.port == port for c in conns):
                return stat.role.split(" ")[0]
        return "other"

    def run(self) -> None:
        self.sample_servers()
        passes = 0
        while not self.stop_event.is_set():
            with self.lock:
                self.sample_children()
                if passes % 4 == 0:
                    self.sample_servers()
            passes += 1
            self.stop_event.wait(self.interval)
        self.sample_servers()

    def worker_rss_mib(self) -> dict[str, float]:
        """Current RSS of each dramatiq worker process (not the parent), by role and pid."""
        with self.lock:
            return {f"{s.role} pid {pid}": round(s.rss / 2**20, 1) for pid, s in self.stats.items()
                    if s.role.startswith("worker") and "(parent)" not in s.role}

    def mark(self) -> None:
        """Count CPU from now on (called when sending starts, so idle start-up time is left out)."""
        with self.lock:
            self._mark()

    def _mark(self) -> None:
        self.sample_children()
        self.sample_servers()
        for stat in (*self.stats.values(), *self.servers.values()):
            stat.cpu_first = stat.cpu_last
        self.machine_first = self.machine_last
        self.started = self.ended

    def stop(self) -> None:
        if not self.is_alive():
            return
        with self.lock:
            self.sample_children()
        self.stop_event.set()
        self.join(timeout=10)

    def summary(self) -> dict[str, Any]:
        per_role: dict[str, dict[str, Any]] = {}
        for pid, stat in sorted(self.stats.items()):
            if stat.role == "bench":
                continue
            per_role[f"{stat.role} pid {pid}"] = {
                "peak_rss_mib": round(stat.peak_rss / 2**20, 1), "cpu_s": round(stat.cpu_seconds, 1)}
        groups: dict[str, float] = defaultdict(float)
        bench = 0.0
        for stat in self.stats.values():
            if stat.role == "bench":
                bench += stat.cpu_seconds
                continue
            groups[stat.role.split(" ")[0]] += stat.cpu_seconds
        pg_by_client: dict[str, float] = defaultdict(float)
        for pid, stat in self.servers.items():
            groups[stat.role] += stat.cpu_seconds
            if stat.role == "postgresql":
                pg_by_client[self.pg_clients.get(pid, "other")] += stat.cpu_seconds
        first, last = self.machine_first, self.machine_last
        busy = sum(getattr(last, f) - getattr(first, f) for f in ("user", "system", "nice", "irq", "softirq",
                                                                    "steal") if hasattr(last, f))
        wall = max(self.ended - self.started, 1e-9)
        ours = sum(groups.values())
        worker_rss = [s.peak_rss for s in self.stats.values() if s.role.startswith("worker")]
        capacity = wall * (os.cpu_count() or 1)
        return {
            "processes": per_role,
            "cpu_seconds_by_group": {k: round(v, 1) for k, v in groups.items()},
            # The "postgresql" group split by whose work it did (the connection's owner).
            "postgresql_cpu_seconds_by_client": {k: round(v, 1) for k, v in sorted(pg_by_client.items())},
            # Share of the whole machine (all cores) per group over the drain: which one saturates.
            "cpu_pct_of_machine_by_group": {k: round(100 * v / capacity, 1) for k, v in groups.items()},
            "machine_idle_pct": round(100 * max(capacity - busy, 0) / capacity, 1),
            "other_cpu_pct": round(100 * (busy - ours - bench) / capacity, 1),
            "bench_cpu_s": round(bench, 1),
            "bench_cpu_pct": round(100 * bench / capacity, 1),
            "machine_cpu_busy_s": round(busy, 1),
            "machine_cpu_capacity_s": round(wall * (os.cpu_count() or 1), 1),
            "machine_cpu_busy_pct": round(100 * busy / (wall * (os.cpu_count() or 1)), 1),
            # Everything else on the machine (other users' jobs, the kernel): interference.
            "other_cpu_s": round(busy - ours - bench, 1),
            "worker_peak_rss_mib_max": round(max(worker_rss, default=0) / 2**20, 1),
            "worker_peak_rss_mib_sum": round(sum(worker_rss) / 2**20, 1),
        }


class FakeProcess:
    """bench/http_fake.py as a child process: its URL, its counters, and its shutdown."""

    def __init__(self, logdir: Path) -> None:
        self.ready = logdir / "http_fake.port"
        out = open(logdir / "http_fake.log", "ab")
        # Its own session (like the workers): a signal to this script's group does not cut it short.
        self.popen = subprocess.Popen([sys.executable, str(ROOT / "bench" / "http_fake.py"), "--port", "0",
                                       "--ready-file", str(self.ready)], stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.ready.exists():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the HTTP fake did not start; see {logdir / 'http_fake.log'}")
            time.sleep(0.05)
        self.port = int(self.ready.read_text())
        self.base_url = f"http://127.0.0.1:{self.port}/v26.0"

    def _call(self, method: str, path: str) -> dict[str, Any]:
        import urllib.request

        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                         data=b"" if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/stats")

    def sends(self) -> int:
        """The sends the fake has answered so far (cheap: one counter)."""
        return int(self._call("GET", "/count")["sends"])

    def reset(self) -> None:
        self._call("POST", "/reset")

    def cpu_seconds(self) -> float:
        try:
            times = psutil.Process(self.popen.pid).cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        return times.user + times.system

    def stop(self) -> None:
        if self.popen.poll() is None:
            _killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)


def fake_checks(conn: psycopg.Connection, stats: dict[str, Any], ids: list[int] | None = None) -> dict[str, Any]:
    """Every sent message reached the fake exactly once, and the fake saw nothing else.

    `ids`: only these messages (the in-process phase); else every message in the database.
    A duplicate is a reference the fake received twice; lost is a sent message the fake never
    saw, or a reference the fake saw whose message is not `sent` (e.g. parked `unknown`)."""
    refs: dict[str, int] = {k: v for k, v in stats["references"].items() if not k.startswith("wire-")}
    if ids is None:
        sent = {str(r[0]) for r in conn.execute("SELECT id FROM messages WHERE status = 'sent'")}
    else:
        sent = {str(r[0]) for r in conn.execute("SELECT id FROM messages WHERE status = 'sent' AND id = ANY(%s)",
                                                (ids,))}
    return {"fake_requests": stats["requests"], "fake_references": len(refs),
            "duplicates": sum(1 for c in refs.values() if c > 1),
            "duplicate_examples": [k for k, c in refs.items() if c > 1][:5],
            "sent_never_seen_by_fake": len(sent - refs.keys()),
            "seen_by_fake_not_sent": len(refs.keys() - sent),
            "without_reference": stats["without_reference"], "refused_by_fake": stats["refused"]}


class Children:
    """Child processes, each in its own session so that SIGTERM/SIGKILL reach their children."""

    def __init__(self, logdir: Path, env: dict[str, str]) -> None:
        self.logdir = logdir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str], *, command: list[str] | None = None,
              **extra_env: str) -> subprocess.Popen[bytes]:
        """Start `lembra ARGS` (or `command`, e.g. the HTTP fake) logging to LOGDIR/NAME.log."""
        out = open(self.logdir / f"{name}.log", "ab")
        proc = subprocess.Popen(command or [LEMBRA, *args], env={**self.env, **extra_env}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def alive(self) -> dict[str, int | None]:
        return {name: proc.poll() for name, proc in self.procs.items()}

    def stop_all(self, grace: float = 20) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            # The group may outlive its leader (dramatiq's worker processes): kill what is left.
            _killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for_workers(redis_url: str, processes: int, children: Children, timeout: float) -> float:
    """Wait until every worker process has polled Redis (dramatiq's heartbeat set)."""
    client = redis.Redis.from_url(redis_url)
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if client.zcard("dramatiq:__heartbeats__") >= processes:
            return time.monotonic() - started
        dead = {k: v for k, v in children.alive().items() if v is not None}
        if dead:
            raise SystemExit(f"worker exited early: {dead}; see {children.logdir}")
        time.sleep(0.2)
    raise SystemExit(f"workers not ready after {timeout:.0f}s; see {children.logdir}")


# ---------------------------------------------------------------------------------------------
# py-spy (optional)
# ---------------------------------------------------------------------------------------------


def start_py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    exe = Path(sys.executable).with_name("py-spy")
    if not exe.exists():
        log("py-spy is not installed in this venv; skipping the profile")
        return None
    return subprocess.Popen([str(exe), "record", "--pid", str(pid), "--duration", str(int(seconds)),
                             "--rate", "100", "--nonblocking", "--gil", "--format", "raw", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarize_collapsed(path: Path, top: int = 25) -> dict[str, Any]:
    """Inclusive share of samples per frame, and per library, from py-spy's collapsed stacks."""
    inclusive: dict[str, int] = defaultdict(int)
    own: dict[str, int] = defaultdict(int)
    libs: dict[str, int] = defaultdict(int)
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        total += count
        frames = stack.split(";")
        seen: set[str] = set()
        for frame in frames:
            if frame not in seen:
                inclusive[frame] += count
                seen.add(frame)
        leaf = frames[-1] if frames else "?"
        own[leaf] += count
        libs[_library(leaf)] += count
    def share(table: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in sorted(table.items(), key=lambda kv: -kv[1])[:top]]
    return {"samples": total, "inclusive_pct": share(inclusive), "self_pct": share(own),
            "self_by_library_pct": share(libs)}


def _library(frame: str) -> str:
    # frames look like "function (path/to/file.py:123)"
    path = frame.rsplit("(", 1)[-1]
    for marker, name in (("sqlalchemy", "sqlalchemy"), ("psycopg", "psycopg"), ("jinja2", "jinja2"),
                         ("dramatiq", "dramatiq"), ("redis", "redis"), ("babel", "babel"),
                         ("engine/", "lembra engine"), ("gateway/", "lembra gateway"),
                         ("providers/", "lembra providers"), ("threading", "threading"),
                         ("json", "json"), ("logging", "logging")):
        if marker in path:
            return name
    return path.split(":")[0].rsplit("/", 1)[-1] or "?"


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


def pg_snapshot(conn: psycopg.Connection) -> dict[str, int]:
    """Counters of this database: commits, WAL position, row updates of `messages` (HOT or not)."""
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT d.xact_commit, d.tup_inserted, d.tup_updated, "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, t.n_tup_upd, t.n_tup_hot_upd "
        "FROM pg_stat_database d, pg_stat_user_tables t "
        "WHERE d.datname = current_database() AND t.relname = 'messages'"
    ).fetchone()
    return dict(zip(("commits", "tuples_inserted", "tuples_updated", "wal_bytes", "messages_updates",
                     "messages_hot_updates"), row))


def open_count(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT (SELECT count(*) FROM messages WHERE status = 'pending')"
        " + (SELECT count(*) FROM messages WHERE status IN ('claimed', 'sending'))"
        " + (SELECT count(*) FROM messages WHERE status = 'new')"
    ).fetchone()[0]


def results(conn: psycopg.Connection, dispatch_started: datetime, provider: str = "sandbox") -> dict[str, Any]:
    """What the run did, from the database: counts by status, rate, lateness percentiles (SQL),
    and with the sandbox its duplicate checks (the HTTP fake's are `fake_checks`)."""
    by_status = dict(conn.execute("SELECT status, count(*) FROM messages GROUP BY status").fetchall())
    first_due, last_due, first_sent, last_sent, sent = conn.execute(
        "SELECT min(due_at), max(due_at), min(sent_at), max(sent_at), count(sent_at) FROM messages"
    ).fetchone()
    lat = conn.execute(
        "SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY l), max(l), min(l) "
        "FROM (SELECT extract(epoch FROM sent_at - due_at)::float8 AS l FROM messages WHERE status = 'sent') s"
    ).fetchone()
    duplicates = recorded = sent_unrecorded = None
    if provider == "sandbox":
        duplicates = conn.execute(
            "SELECT count(*) FROM (SELECT org_id, idempotency_key FROM sandbox_messages "
            "GROUP BY org_id, idempotency_key HAVING count(*) > 1) d"
        ).fetchone()[0]
        recorded = conn.execute("SELECT count(*) FROM sandbox_messages").fetchone()[0]
        sent_unrecorded = conn.execute(
            "SELECT count(*) FROM messages m WHERE m.status = 'sent' AND NOT EXISTS "
            "(SELECT 1 FROM sandbox_messages s WHERE s.org_id = m.org_id "
            "AND s.idempotency_key = m.idempotency_key)"
        ).fetchone()[0]
    per_second = [row[0] for row in conn.execute(
        "SELECT count(*) FROM messages WHERE status = 'sent' GROUP BY date_trunc('second', sent_at) ORDER BY 1"
    ).fetchall()]
    events = conn.execute("SELECT count(*) FROM message_events").fetchone()[0]
    events_by_kind = dict(conn.execute("SELECT event, count(*) FROM message_events GROUP BY event").fetchall())
    sent_without_event = conn.execute(
        "SELECT count(*) FROM messages m WHERE m.status = 'sent' AND NOT EXISTS "
        "(SELECT 1 FROM message_events e WHERE e.message_id = m.id AND e.event = 'sent')"
    ).fetchone()[0]
    out: dict[str, Any] = {
        "messages_by_status": by_status,
        "sent_without_sent_event": sent_without_event,
        "sent": sent,
        "not_sent": sum(v for k, v in by_status.items() if k != "sent"),
        "duplicate_idempotency_keys": duplicates,
        "sandbox_rows": recorded,
        "sent_without_sandbox_row": sent_unrecorded,
        "message_events": events,
        "message_events_by_kind": events_by_kind,
        "first_due_at": first_due.isoformat() if first_due else None,
        "last_due_at": last_due.isoformat() if last_due else None,
        "dispatch_started_at": dispatch_started.isoformat(),
    }
    if sent:
        start = max(dispatch_started, first_due)
        out["messages_per_s_first_to_last_sent"] = round((sent - 1) / max((last_sent - first_sent).total_seconds(),
                                                                           1e-9), 1)
        out["messages_per_s_from_dispatch_start"] = round(sent / max((last_sent - start).total_seconds(), 1e-9), 1)
        out["drain_seconds_from_dispatch_start"] = round((last_sent - start).total_seconds(), 1)
        out["first_send_after_dispatch_start_s"] = round((first_sent - start).total_seconds(), 2)
        busy = sorted(per_second[1:-1]) or sorted(per_second)
        out["per_second_median"] = busy[len(busy) // 2]
        out["per_second_max"] = busy[-1]
        out["lateness_s"] = {"p50": round(lat[0][0], 2), "p95": round(lat[0][1], 2), "p99": round(lat[0][2], 2),
                             "max": round(lat[1], 2), "min": round(lat[2], 2)}
    return out


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--appointments", type=int, default=100_000)
    p.add_argument("--orgs", type=int, default=10)
    p.add_argument("--contacts-per-appointment", type=float, default=None,
                   help="contacts created per appointment; at 1 or more each appointment is its own patient's. "
                        "Default: 1 for a send run, whose reminders all fall due within seconds (two to one patient "
                        "go 6 s apart on Meta, so at 0.5 the drain measures that rule), 0.5 with --populate-only "
                        "(a patient has two appointments on average, as in the recorded populate runs)")
    p.add_argument("--workers", type=int, default=2, help="dramatiq worker processes")
    p.add_argument("--threads", type=int, default=SEND_THREADS, help="send threads per worker process")
    p.add_argument("--worker-layout", choices=("single", "separate"), default="single",
                   help="single: one `lembra worker --processes W`; separate: W x `lembra worker --processes 1`")
    p.add_argument("--populate-only", action="store_true", help="load and time populate, send nothing")
    p.add_argument("--bare-write-variants", default="all",
                   help="populate-only: the bare write's variants besides the two full writes, comma-separated "
                        "names (fk:messages.contact_id, index:messages_due, idempotency, events, floor, "
                        "fk:org-scoped, ...; bench/bare_write.py), or 'all'")
    p.add_argument("--bare-write-repeat", type=int, default=1,
                   help="populate-only: write every variant of the bare write's account this many times")
    p.add_argument("--no-bare-write", dest="bare_write", action="store_false",
                   help="populate-only: skip the bare write (populate's rows written again on their own, "
                        "bench/bare_write.py)")
    p.add_argument("--realistic-window", action="store_true",
                   help="orgs keep the default window (08:00-20:00, no Sundays/holidays); populate-only")
    p.add_argument("--spread", type=float, default=10.0, help="seconds over which the reminders fall due")
    p.add_argument("--lead", type=float, default=None,
                   help="seconds from the end of the load to the first due time (default: estimated)")
    p.add_argument("--timeout", type=float, default=1800, help="hard limit on the sending phase, seconds")
    p.add_argument("--dispatch-interval", default="0.2", help="LEMBRA_DISPATCH_INTERVAL of the scheduler")
    p.add_argument("--populate-interval", default="60", help="LEMBRA_POPULATE_INTERVAL of the scheduler")
    p.add_argument("--send-batch", default=None, help="LEMBRA_SEND_BATCH (engine default when unset)")
    p.add_argument("--claim-batch", default=None, help="LEMBRA_CLAIM_BATCH (engine default when unset)")
    p.add_argument("--send-concurrency", default=None,
                   help="LEMBRA_SEND_CONCURRENCY, provider calls in flight per worker process (engine default when unset)")
    p.add_argument("--py-spy", type=float, default=0, metavar="SECONDS",
                   help="record this many seconds of one worker process with py-spy (--gil: samples holding the GIL, i.e. Python CPU) once sending starts")
    p.add_argument("--db-name", default="lembra_bench")
    p.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres", help="libpq server connection")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/14", help="broker URL; its db is FLUSHDB'd")
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--profile-populate", action="store_true",
                   help="run the timed populate under cProfile and print where its time goes (slows it)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    p.add_argument("--provider", choices=("sandbox", "http-fake"), default="sandbox",
                   help="sandbox: the in-process sandbox channel; http-fake: a Meta channel whose base_url is "
                        "bench/http_fake.py, a separate loopback process speaking the Cloud API wire format")
    p.add_argument("--rules", type=int, default=1,
                   help="reminder rules per org (2 h before; then, populate-only, 24 h, 48 h ... before; "
                        "in a send run 119, 118 ... min before, so every reminder falls due during the run)")
    p.add_argument("--rate", type=float, default=None,
                   help="steady-rate mode: reminders fall due continuously at this rate (per second) for "
                        "--duration seconds instead of all within --spread")
    p.add_argument("--duration", type=float, default=60, help="steady-rate mode: seconds of due reminders")
    p.add_argument("--scale", type=lambda text: [int(x) for x in text.split(",") if x.strip()], default=None,
                   metavar="W1,W2,...", help="run the whole benchmark once per worker-process count (fresh data)")
    p.add_argument("--inline", type=int, default=1000, metavar="N",
                   help="after the run, claim and send N more messages in this process with every SQL "
                        "statement counted (0: skip)")
    p.add_argument("--wire-seconds", type=float, default=15,
                   help="http-fake: seconds of the bare requests baseline (0: skip)")
    args = p.parse_args(argv)
    if args.rate:
        # R per second for D seconds: N appointments x rules reminders spread evenly over D.
        args.appointments = max(int(args.rate * args.duration / args.rules), 1)
        args.spread = args.duration
        if args.rules > 1:
            p.error("--rate with --rules > 1 is not supported (the second rule's reminders would overlap)")
    if not args.db_name.startswith("lembra_bench"):
        p.error("--db-name must start with lembra_bench (the database is dropped)")
    if args.contacts_per_appointment is None:
        args.contacts_per_appointment = 0.5 if args.populate_only else 1.0
    if args.realistic_window and not args.populate_only:
        p.error("--realistic-window only makes sense with --populate-only")
    return args


def populate_breakdown(profiler: Any, wall: float) -> dict[str, float]:
    """Inclusive seconds of populate's steps (under cProfile, which slows the Python parts)."""
    import pstats

    stats = pstats.Stats(profiler)
    wanted = {
        "insert_reminders (set-based INSERT ... SELECT)": ("engine/reminders/populate.py", "_insert_reminders"),
        "cancel_stale": ("engine/reminders/populate.py", "_cancel_stale"),
        "plan_new (all)": ("engine/reminders/populate.py", "plan_new"),
        "plan_new: windows.place": ("engine/reminders/windows.py", "place"),
        "plan_new: nominal_due": ("engine/reminders/windows.py", "nominal_due"),
        "plan_new + insert: record_events": ("engine/queue/outbox.py", "record_events"),
        "all SQL: psycopg Cursor.execute": ("psycopg/cursor.py", "execute"),
        "all SQL: psycopg Cursor.executemany": ("psycopg/cursor.py", "executemany"),
    }
    out = {"wall_s_under_profile": round(wall, 2)}
    for label, (suffix, name) in wanted.items():
        out[label] = round(sum(v[3] for (path, _l, func), v in stats.stats.items()  # type: ignore[attr-defined]
                               if path.endswith(suffix) and func == name), 2)
    return out


def sqlalchemy_url(pg: str, dbname: str) -> str:
    parts = dict(item.split("=", 1) for item in pg.split())
    user = parts.get("user", "postgres")
    password = f":{parts['password']}" if "password" in parts else ""
    return (f"postgresql+psycopg://{user}{password}@{parts.get('host', '127.0.0.1')}:{parts.get('port', '5432')}"
            f"/{dbname}")


def _terminated(signum: int, _frame: Any) -> None:
    # Once: a second SIGTERM (e.g. `timeout` signals its whole process group too) must not cut
    # the clean-up short and leave workers behind.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    configure_logs("WARNING", "text")
    machine = machine_info(f"{args.pg} dbname=postgres", args.redis)
    code = code_version()
    log(f"machine: {machine['nproc']} CPU ({machine['cpu_model']}), {machine['memory_gib']} GiB, "
        f"Python {machine['python']}, {machine['postgresql']}, Redis {machine['redis']}, "
        f"load {machine['loadavg_before']}; code {code['commit']}"
        + (" + uncommitted engine changes" if code["engine_dirty"] else ""))
    if not args.scale:
        report: dict[str, Any] = {"args": _jsonable(vars(args)), "machine": machine, "code": code}
        try:
            return _one_run(args, report)
        finally:
            if args.json:
                args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
                log(f"figures written to {args.json}")
    # --scale 1,2,4: the whole run (fresh database, populate, send, in-process and wire phases)
    # once per worker-process count, then one table row each.
    runs: list[dict[str, Any]] = []
    status = 0
    try:
        for workers in args.scale:
            sub = argparse.Namespace(**{**vars(args), "workers": workers, "json": None})
            report = {"args": _jsonable(vars(sub)), "machine": machine, "code": code}
            runs.append(report)
            log(f"=== scale: {workers} worker process(es) x {args.threads} threads")
            status |= _one_run(sub, report)
    finally:
        _print_scale(runs)
        if args.json:
            args.json.write_text(json.dumps({"machine": machine, "code": code, "runs": runs}, indent=2,
                                            default=str) + "\n")
            log(f"figures written to {args.json}")
    return status


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}


def _one_run(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """One fresh database, populated and (unless --populate-only) sent; dropped afterwards."""
    conninfo = f"{args.pg} dbname={args.db_name}"
    database_url = sqlalchemy_url(args.pg, args.db_name)
    create_database(args.pg, args.db_name)
    logdir = Path(tempfile.mkdtemp(prefix="lembra-bench-"))
    report["logdir"] = str(logdir)
    fake = None
    try:
        if args.provider == "http-fake" and not args.populate_only:
            fake = FakeProcess(logdir)
            log(f"HTTP fake (Meta Cloud API wire format) pid {fake.popen.pid} at {fake.base_url}")
        return _run(args, conninfo, database_url, report, logdir, fake)
    finally:
        if fake is not None:
            fake.stop()
        if args.keep:
            log(f"kept database {args.db_name}")
        else:
            drop_database(args.pg, args.db_name)
            log(f"dropped database {args.db_name}")


def _run(args: argparse.Namespace, conninfo: str, database_url: str, report: dict[str, Any], logdir: Path,
         fake: FakeProcess | None) -> int:
    n = args.appointments
    upgrade(database_url)
    secret_keys = Keyring.generate_spec()
    keyring = Keyring.parse(secret_keys)
    db = Database(database_url)
    tz = pick_timezone()
    offsets = rule_offsets(args.rules, args.populate_only)
    org_ids = create_orgs(db, keyring, args.orgs, tz, args.realistic_window, provider=args.provider,
                          # populate-only sends nothing: the Meta channels need an address, not a server
                          fake_base_url=fake.base_url if fake else "http://127.0.0.1:9/v26.0", offsets=offsets)
    log(f"{len(org_ids)} orgs in {tz}, {args.provider} channels, rules {offsets} min before; "
        f"loading {n:,} appointments")

    # The first reminder is due `lead` seconds after the load: enough for populate, its no-op
    # repeat, the workers' start and the scheduler's own first populate pass.
    lead = args.lead if args.lead is not None else 30 + n * len(offsets) / 1500
    due_from = None
    if not args.populate_only:
        due_from = datetime.now(UTC) + timedelta(seconds=lead)
    plan = LoadPlan(org_ids=org_ids, appointments=n, contacts_per_appointment=args.contacts_per_appointment,
                    tz=tz, due_from=due_from, spread=args.spread)
    load = bulk_load(conninfo, plan)
    report["load"] = {"appointments": n, "contacts": plan.contacts(), "orgs": len(org_ids), "timezone": tz,
                      "rules_offset_minutes": offsets, "provider": args.provider,
                      **{k: round(v, 1) for k, v in load.items()}}
    log(f"loaded {n:,} appointments, {plan.contacts():,} contacts in {load['copy_s']:.1f}s "
        f"(+{load['analyze_s']:.1f}s VACUUM ANALYZE)")

    profiler = None
    if args.profile_populate:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    populate_pg_cpu_used = cpu_meter(args.db_name)
    started, cpu0 = time.perf_counter(), time.process_time()
    first = populate(db, horizon=HORIZON)
    populate_s, populate_cpu = time.perf_counter() - started, time.process_time() - cpu0
    populate_pg_cpu = populate_pg_cpu_used()
    if profiler is not None:
        profiler.disable()
        report["populate_profile"] = populate_breakdown(profiler, populate_s)
    started, since = time.perf_counter(), datetime.now(UTC)
    again = populate(db, horizon=HORIZON)
    repeat_s = time.perf_counter() - started
    # The scheduler's periodic pass after that one: what changed since it started (nothing). The
    # scheduler looks CHANGED_SINCE_MARGIN further back, which here would take in the whole load.
    started = time.perf_counter()
    changed = populate_changed(db, horizon=HORIZON, since=since)
    changed_s = time.perf_counter() - started
    report["populate"] = {
        "seconds": round(populate_s, 2), "appointments_per_s": round(n / populate_s, 1),
        "reminders_per_s": round(first.created / populate_s, 1),
        "python_cpu_seconds": round(populate_cpu, 2), "postgresql_cpu_seconds": round(populate_pg_cpu, 2),
        "created": first.created, "planned": first.planned, "skipped": first.skipped,
        "repeat_pass_seconds": round(repeat_s, 2), "repeat_created": again.created,
        "incremental_pass_seconds": round(changed_s, 2), "incremental_created": changed.created,
    }
    log(f"populate: {n:,} appointments x {len(offsets)} rule(s) in {populate_s:.1f}s = "
        f"{n / populate_s:,.0f} appointments/s (created {first.created:,}, planned {first.planned:,}, "
        f"skipped {first.skipped:,}; CPU: {populate_cpu:.1f}s Python in this process, "
        f"{populate_pg_cpu:.1f}s PostgreSQL); repeat full pass (nothing new) {repeat_s:.1f}s, created {again.created}; "
        f"the scheduler's incremental pass after it {changed_s:.2f}s, created {changed.created}")
    if first.created != n * len(offsets) or again.created != 0 or changed.created != 0:
        log(f"WARNING: populate did not create exactly {len(offsets)} reminder(s) per appointment")
    if "populate_profile" in report:
        log("populate under cProfile, inclusive seconds: " + json.dumps(report["populate_profile"]))
    if args.populate_only:
        with psycopg.connect(conninfo) as conn:
            report["populate"]["messages_by_status"] = dict(conn.execute(
                "SELECT status, count(*) FROM messages GROUP BY status").fetchall())
        db.dispose()
        if args.bare_write:
            report["populate"]["bare_write"] = bare_writes(args, conninfo, populate_s)
        _print_summary(report)
        return 0
    db.dispose()
    return _send(args, conninfo, database_url, secret_keys, due_from, report, logdir, fake, tz)


def _send(args: argparse.Namespace, conninfo: str, database_url: str, secret_keys: str,
          due_from: datetime | None, report: dict[str, Any], logdir: Path, fake: FakeProcess | None,
          tz: str) -> int:
    redis.Redis.from_url(args.redis).flushdb()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMBRA_", "DATABASE_URL", "BROKER_URL"))}
    env.update(engine_env(args, database_url, secret_keys))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        expected = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    wire_before: dict[str, Any] | None = None
    if fake is not None and args.wire_seconds > 0:
        sample = probe_body(args, database_url, secret_keys, fake)
        log(f"bare wire before the drain: requests, {args.workers} process(es) x {calls_in_flight(args)} threads, "
            f"{args.wire_seconds:.0f}s")
        wire_before = measure_wire(args, fake, sample, client="requests")
        if due_from is not None and datetime.now(UTC) > due_from - timedelta(seconds=10):
            log("WARNING: the wire before the drain ran into the lead; raise --lead")
    children = Children(logdir, env)
    sampler = Sampler(children.procs, args.db_name, extra={"http_fake": fake.popen} if fake else None)
    log(f"starting {args.workers} worker process(es) x {args.threads} threads ({args.worker_layout}); "
        f"{expected:,} messages; logs in {logdir}")
    if args.worker_layout == "single":
        children.start("worker", ["worker", "--processes", str(args.workers), "--threads", str(args.threads)])
    else:
        for index in range(args.workers):
            children.start(f"worker{index}", ["worker", "--processes", "1", "--threads", str(args.threads)])
    spy: subprocess.Popen[bytes] | None = None
    spy_out = logdir / "worker.pyspy.txt"
    timed_out = False
    polls = 0
    # Worker RSS when 25/50/75/100 % of the messages are sent: flat, or growing with the drain?
    checkpoints = [0.25, 0.5, 0.75, 1.0]
    rss_at: dict[str, dict[str, float]] = {}
    # Progress: the sends the provider has seen. The fake counts them for free; the sandbox's are
    # rows. Counting `sent` or open rows in `messages` reads the whole backlog (0.5 s of
    # PostgreSQL a poll at a million rows: CPU the pipeline under test then lacks), so the open
    # rows are counted only once the provider has seen every message, or every 10 s for a run
    # where some never reach it.
    sandbox_sends = "SELECT count(*) FROM sandbox_messages"
    remaining: int | None = None
    last_open_count = 0.0
    try:
        sampler.start()
        ready_s = wait_for_workers(args.redis, args.workers, children, timeout=120)
        log(f"workers ready in {ready_s:.1f}s")
        if due_from is not None and datetime.now(UTC) > due_from:
            log(f"WARNING: the first reminders fell due {(datetime.now(UTC) - due_from).total_seconds():.0f}s before "
                "the scheduler started; raise --lead (their lateness includes the wait)")
        with psycopg.connect(conninfo, autocommit=True) as conn:
            pg_before = pg_snapshot(conn)
        dispatch_started = datetime.now(UTC)
        children.start("scheduler", ["scheduler"])
        wait_s = (due_from - dispatch_started).total_seconds() if due_from else 0
        last_due_s = wait_s + args.spread + 60 * (len(report["load"]["rules_offset_minutes"]) - 1)
        log(f"scheduler started; first reminder due in {wait_s:.1f}s, last in {last_due_s:.1f}s")

        deadline = time.monotonic() + args.timeout + max(last_due_s, 0)
        last_report = 0.0
        previous_sent, previous_t = 0, time.monotonic()
        marked = False
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while True:
                time.sleep(1)
                if fake is not None:
                    sent = fake.sends()
                else:
                    polls += 1
                    sent = conn.execute(sandbox_sends).fetchone()[0]
                if sent >= expected or time.monotonic() - last_open_count >= 10:
                    polls += 1
                    remaining = open_count(conn)
                    last_open_count = time.monotonic()
                if sent and not marked:
                    sampler.mark()
                    marked = True
                while checkpoints and sent >= checkpoints[0] * expected:
                    rss_at[f"{int(100 * checkpoints.pop(0))}%"] = sampler.worker_rss_mib()
                if args.py_spy and spy is None and sent > 0:
                    targets = [p for p in sampler.stats.items() if p[1].role.startswith("worker") and " #" in p[1].role]
                    if targets:
                        pid = targets[0][0]
                        spy = start_py_spy(pid, args.py_spy, spy_out)
                        log(f"py-spy recording worker pid {pid} for {args.py_spy:.0f}s")
                now = time.monotonic()
                if now - last_report >= 5:
                    rate = (sent - previous_sent) / (now - previous_t)
                    log(f"sent {sent:,}/{expected:,} (as the provider saw them), open {remaining:,} "
                        f"(counted {time.monotonic() - last_open_count:.0f}s ago), last 5s {rate:,.0f} msg/s")
                    last_report, previous_sent, previous_t = now, sent, now
                if remaining == 0 and (due_from is None or datetime.now(UTC) > due_from):
                    break
                dead = {k: v for k, v in children.alive().items() if v is not None}
                if dead:
                    log(f"WARNING: a process exited during the run: {dead}")
                    break
                if now > deadline:
                    log(f"WARNING: timed out after {args.timeout:.0f}s with {remaining:,} messages open")
                    timed_out = True
                    break
    finally:
        # Also on an exception or SIGTERM: never leave workers or a scheduler behind.
        if spy is not None:
            try:
                spy.wait(timeout=args.py_spy + 30)
            except subprocess.TimeoutExpired:
                spy.kill()
        sampler.stop()
        children.stop_all()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        pg_after = pg_snapshot(conn)
        report["send"] = results(conn, dispatch_started, args.provider)
        fake_stats = None
        if fake is not None:
            fake_stats = fake.stats()
            report["send"]["fake"] = fake_checks(conn, fake_stats)
            fake.reset()
    sent_n = max(report["send"]["sent"] or 0, 1)
    delta = {k: pg_after[k] - pg_before[k] for k in pg_before}
    delta["commits"] -= polls + 2  # this script's own polling, one autocommit transaction per query
    report["postgres"] = {
        **{f"{k}_total": v for k, v in delta.items()},
        "commits_per_message": round(delta["commits"] / sent_n, 2),
        "wal_kib_per_message": round(delta["wal_bytes"] / sent_n / 1024, 2),
        "messages_updates_per_message": round(delta["messages_updates"] / sent_n, 2),
        "messages_hot_update_pct": round(100 * delta["messages_hot_updates"] / max(delta["messages_updates"], 1), 1),
        "tuples_inserted_per_message": round(delta["tuples_inserted"] / sent_n, 2),
    }
    report["send"]["timed_out"] = timed_out
    report["send"]["workers_ready_s"] = round(ready_s, 1)
    report["resources"] = sampler.summary()
    report["resources"]["worker_rss_mib_at_drain_pct"] = rss_at
    report["resources"]["worker_rss_growth_mib_25_to_100"] = _rss_growth(rss_at)
    groups = report["resources"]["cpu_seconds_by_group"]
    per_msg = {k: round(1000 * v / sent_n, 2) for k, v in groups.items()}
    ours = sum(groups.values())
    report["resources"]["cpu_ms_per_message"] = per_msg
    report["resources"]["postgresql_cpu_ms_per_message_by_client"] = {
        k: round(1000 * v / sent_n, 3) for k, v in report["resources"]["postgresql_cpu_seconds_by_client"].items()}
    report["resources"]["cpu_ms_per_message_total"] = round(1000 * ours / sent_n, 2)
    # If nothing else ran on the machine and every core were busy with this pipeline only.
    report["resources"]["ceiling_messages_per_s_dedicated_cores"] = round(
        (os.cpu_count() or 1) * sent_n / max(ours, 1e-9), 0)
    if spy is not None and spy_out.exists():
        report["py_spy"] = summarize_collapsed(spy_out)
        report["py_spy"]["file"] = str(spy_out)
    if args.inline > 0:
        log(f"in-process phase: {args.inline:,} more messages through the engine here, counting statements")
        report["inline"] = run_inline(args, conninfo, database_url, secret_keys, tz, fake)
    if fake is not None and args.wire_seconds > 0 and fake_stats and fake_stats.get("sample_body"):
        lembra_rate = report["send"].get("messages_per_s_first_to_last_sent") or 0
        # `requests` is the baseline the goal names; urllib3 is the client the engine itself uses.
        for key, client in (("wire", "requests"), ("wire_urllib3", "urllib3")):
            log(f"bare wire: {client}, {args.workers} process(es) x {calls_in_flight(args)} threads "
                f"(the workers' provider calls in flight), {args.wire_seconds:.0f}s")
            report[key] = measure_wire(args, fake, fake_stats, client=client)
            report[key]["lembra_fraction_of_wire"] = round(lembra_rate / max(report[key]["messages_per_s"], 1e-9), 3)
        if wire_before is not None and "wire" in report:
            # The goal's figure: Lembra against the mean of the wire just before and just after it.
            after = report["wire"]
            after["after_messages_per_s"] = after["messages_per_s"]
            after["after_client_cpu_ms_per_request"] = after["client_cpu_ms_per_request"]
            after["before"] = wire_before
            after["messages_per_s"] = round((wire_before["messages_per_s"] + after["after_messages_per_s"]) / 2, 1)
            after["lembra_fraction_of_wire_after"] = after["lembra_fraction_of_wire"]
            after["lembra_fraction_of_wire_before"] = round(lembra_rate / max(wire_before["messages_per_s"], 1e-9), 3)
            after["lembra_fraction_of_wire"] = round(lembra_rate / max(after["messages_per_s"], 1e-9), 3)
    _print_summary(report)
    return 0 if run_ok(report) else 1


def bare_writes(args: argparse.Namespace, conninfo: str, populate_s: float) -> dict[str, Any]:
    """Populate's rows written again on their own (bench/bare_write.py): full writes, and between
    them the account of what each guarantee costs (each foreign key, each index, the idempotency
    key, the events at creation). A variant's cost is the mean of the full writes on either side of
    it minus its own time (wall and PostgreSQL CPU), also as a share of that and of populate's time;
    with `--bare-write-repeat`, each variant's costs are listed and their mean is taken."""
    from bare_write import account

    names = None if args.bare_write_variants == "all" else set(args.bare_write_variants.split(","))
    log(f"bare write: populate's reminders and their events written again into the emptied tables, "
        f"{PARALLEL_ORGS} connection(s), once per variant, between full writes")
    writes = account(conninfo, PARALLEL_ORGS, lambda: cpu_meter(args.db_name), names=names,
                     repeat=args.bare_write_repeat, log=log)
    fulls = [w for w in writes if w.variant == "full"]
    full = sum(w.seconds for w in fulls) / len(fulls) if fulls else float("nan")
    full_cpu = sum(w.postgresql_cpu_seconds for w in fulls) / len(fulls) if fulls else float("nan")
    rows: dict[str, dict[str, Any]] = {}
    for i, w in enumerate(writes):
        if w.variant == "full":
            continue
        # The full writes on either side of this one (the sequence starts and ends with one).
        before = next((x for x in reversed(writes[:i]) if x.variant == "full"), None)
        after = next((x for x in writes[i + 1:] if x.variant == "full"), None)
        around = [x for x in (before, after) if x is not None] or fulls
        ref = sum(x.seconds for x in around) / len(around)
        ref_cpu = sum(x.postgresql_cpu_seconds for x in around) / len(around)
        row = rows.setdefault(w.variant, {"variant": w.variant, "label": w.label, "seconds": [], "reference_seconds": [],
                                          "postgresql_cpu_seconds": [], "cost_seconds": [], "cost_cpu_seconds": [],
                                          "load_before": []})
        row["seconds"].append(round(w.seconds, 2))
        row["reference_seconds"].append(round(ref, 2))
        row["postgresql_cpu_seconds"].append(round(w.postgresql_cpu_seconds, 2))
        row["cost_seconds"].append(round(ref - w.seconds, 2))
        row["cost_cpu_seconds"].append(round(ref_cpu - w.postgresql_cpu_seconds, 2))
        row["load_before"].append(round(w.load_before, 2))
    for row in rows.values():
        cost = sum(row["cost_seconds"]) / len(row["cost_seconds"])
        ref = sum(row["reference_seconds"]) / len(row["reference_seconds"])
        row |= {"cost_mean_seconds": round(cost, 2), "cost_share_of_reference": round(cost / ref, 3),
                "cost_share_of_populate": round(cost / populate_s, 3),
                "cost_cpu_mean_seconds": round(sum(row["cost_cpu_seconds"]) / len(row["cost_cpu_seconds"]), 2)}
    return {"rows": writes[0].rows if writes else 0, "connections": writes[0].connections if writes else 0,
            "full_seconds": [round(w.seconds, 2) for w in fulls],
            "full_postgresql_cpu_seconds": [round(w.postgresql_cpu_seconds, 2) for w in fulls],
            "full_load_before": [round(w.load_before, 2) for w in fulls],
            "full_mean_seconds": round(full, 2), "full_mean_postgresql_cpu_seconds": round(full_cpu, 2),
            "full_spread_seconds": round(max(w.seconds for w in fulls) - min(w.seconds for w in fulls), 2)
            if fulls else None,
            "populate_over_full": round(populate_s / full, 2), "variants": list(rows.values())}


def engine_env(args: argparse.Namespace, database_url: str, secret_keys: str) -> dict[str, str]:
    """The environment of `lembra worker`/`lembra scheduler` (and of the in-process phase)."""
    env = {
        "DATABASE_URL": database_url, "BROKER_URL": args.redis, "LEMBRA_SECRET_KEYS": secret_keys,
        "LEMBRA_LOG_LEVEL": "WARNING", "LEMBRA_DISPATCH_INTERVAL": args.dispatch_interval,
        "LEMBRA_POPULATE_INTERVAL": args.populate_interval, "PYTHONUNBUFFERED": "1",
        # This checkout's engine, not whichever one the venv's editable install points at: run
        # from another worktree (an A/B of two commits), the workers and the scheduler run its code.
        "PYTHONPATH": str(ROOT),
    }
    if args.provider == "http-fake":
        # The egress guard refuses loopback unless ops allow it; the fake listens on 127.0.0.1.
        env["LEMBRA_PROVIDER_ALLOW"] = "127.0.0.1"
    if args.send_batch:
        env["LEMBRA_SEND_BATCH"] = args.send_batch
    if args.claim_batch:
        env["LEMBRA_CLAIM_BATCH"] = args.claim_batch
    if args.send_concurrency:
        env["LEMBRA_SEND_CONCURRENCY"] = args.send_concurrency
    return env


def calls_in_flight(args: argparse.Namespace) -> int:
    """Provider calls one worker process has in flight at most: its actor threads share one pool
    of `LEMBRA_SEND_CONCURRENCY` threads, so the bare wire runs that many threads per process."""
    from engine.core.config import Settings

    defaults = Settings()
    concurrency = int(args.send_concurrency or defaults.send_concurrency)
    batch = int(args.send_batch or defaults.send_batch)
    return max(1, min(concurrency, args.threads * batch))


def _rss_growth(rss_at: dict[str, dict[str, float]]) -> float | None:
    """Largest RSS growth of one worker process from 25 % to 100 % of the drain (MiB)."""
    first, last = rss_at.get("25%"), rss_at.get("100%")
    if not first or not last:
        return None
    return round(max((last[k] - first[k] for k in first if k in last), default=0.0), 1)


def run_ok(report: dict[str, Any]) -> bool:
    """The exit status: nothing unsent, duplicated or lost, and no timeout (main and in-process)."""
    send = report["send"]
    ok = send["not_sent"] == 0 and not send["timed_out"] and send.get("sent_without_sent_event", 0) == 0
    ok = ok and not send.get("duplicate_idempotency_keys") and not send.get("sent_without_sandbox_row")
    for checks in (send.get("fake"), (report.get("inline") or {}).get("fake")):
        if checks:
            ok = ok and checks["duplicates"] == 0 and checks["sent_never_seen_by_fake"] == 0 \
                and checks["seen_by_fake_not_sent"] == 0
    inline = report.get("inline")
    if inline:
        ok = ok and inline["not_sent"] == 0
    return ok


# ---------------------------------------------------------------------------------------------
# In-process phase: the same sends in this process, every SQL statement counted
# ---------------------------------------------------------------------------------------------


class StatementCounter:
    """Counts SQL statements (by verb) and commits on one SQLAlchemy engine while `on`.

    An executemany counts as the number of parameter sets it carries: it is one round trip for
    psycopg's pipeline, but PostgreSQL runs each set as a statement, and counting it once would
    make a per-row loop folded into executemany look free."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import event

        self.on = False
        self.statements: dict[str, int] = defaultdict(int)
        self.executemany_calls = 0
        self.commits = 0
        self.checkouts = 0
        # pool_pre_ping runs its `SELECT 1` on the DBAPI cursor, below the events above: count
        # pool checkouts instead (one ping each when the engine pre-pings).
        self.pre_ping = bool(getattr(engine.pool, "_pre_ping", False))
        event.listen(engine, "before_cursor_execute", self._execute)
        event.listen(engine, "commit", self._commit)
        event.listen(engine.pool, "checkout", self._checkout)

    def _execute(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                 executemany: bool) -> None:
        if not self.on:
            return
        verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
        if verb == "WITH":  # the claim's locking CTE is an UPDATE
            verb = "WITH…UPDATE" if " UPDATE " in statement.upper() else "WITH…SELECT"
        if executemany:
            self.executemany_calls += 1
            self.statements[verb] += len(parameters) if isinstance(parameters, (list, tuple)) else 1
        else:
            self.statements[verb] += 1

    def _commit(self, conn: Any) -> None:
        if self.on:
            self.commits += 1

    def _checkout(self, dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if self.on:
            self.checkouts += 1

    def reset(self) -> None:
        self.statements.clear()
        self.executemany_calls = self.commits = self.checkouts = 0


def run_inline(args: argparse.Namespace, conninfo: str, database_url: str, secret_keys: str, tz: str,
               fake: FakeProcess | None) -> dict[str, Any]:
    """Claim `--inline` fresh messages and send them through the engine in this process.

    Like bench/flows.py --inline: no broker and no other process, so every SQL statement and
    commit can be counted. It calls `engine.messaging.dispatch.send_batch(rt, ids)` with the ids the
    scheduler would hand one actor (LEMBRA_SEND_BATCH, 25) when the engine has it, else
    `dispatch.send_one` per id, as the `send_messages` actor does."""
    from engine.messaging import dispatch
    from engine.core.config import Settings
    from engine.store.runtime import Runtime, install

    k = args.inline
    with psycopg.connect(conninfo, autocommit=True) as pg:
        # Appointments of existing contacts (all with consent) whose first rule falls due in 3 s;
        # the other rules' reminders fall due minutes later and are not part of this phase.
        starts = datetime.now(UTC) + timedelta(minutes=RULE_OFFSET_MINUTES, seconds=3)
        pg.execute(
            "INSERT INTO appointments (org_id, contact_id, professional, starts_at, timezone, mode, location, "
            "status, created_at, updated_at) "
            "SELECT c.org_id, c.id, 'Dra. Helena Prado', %s, %s, 'in_person', 'Rua das Flores, 100', 'scheduled', "
            "now(), now() FROM generate_series(1, %s) g "
            "JOIN contacts c ON c.id = 1 + (g - 1) %% (SELECT max(id) FROM contacts)", (starts, tz, k))
    settings = Settings.from_env({**engine_env(args, database_url, secret_keys), "BROKER_URL": "stub://"})
    rt = Runtime.build(settings)
    previous = install(rt)
    send_batch = getattr(dispatch, "send_batch", None)
    batch = settings.send_batch
    out: dict[str, Any] = {"messages": k, "send_batch": batch,
                           "entry_point": "dispatch.send_batch" if send_batch else "dispatch.send_one per id"}
    try:
        populate(rt.db, horizon=HORIZON)
        time.sleep(max((starts - timedelta(minutes=RULE_OFFSET_MINUTES) - datetime.now(UTC)).total_seconds(), 0) + 0.5)
        ids: list[int] = []
        while len(ids) < k:
            claimed = dispatch.claim_due(rt, limit=min(1000, k - len(ids)))
            if not claimed:
                break
            ids += claimed
        out["claimed"] = len(ids)
        chunks = [ids[i:i + batch] for i in range(0, len(ids), batch)]

        def send(chunk: list[int]) -> None:
            if send_batch is not None:
                send_batch(rt, chunk)
            else:
                for message_id in chunk:
                    dispatch.send_one(rt, message_id)

        # Warm up (provider session, compiled statements, pool) on the first chunk, uncounted.
        if chunks:
            send(chunks.pop(0))
        measured = [mid for chunk in chunks for mid in chunk]
        counter = StatementCounter(rt.db.engine)
        fake_cpu0 = fake.cpu_seconds() if fake else 0.0
        pg_cpu_used = cpu_meter(args.db_name)
        with psycopg.connect(conninfo, autocommit=True) as pg:
            before = pg_snapshot(pg)
            counter.on = True
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for chunk in chunks:
                send(chunk)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            counter.on = False
            # Read before the pool is closed: a backend that has exited takes its CPU time with it.
            pg_cpu = pg_cpu_used()
            # The engine's pooled backends report their commits to pg_stat asynchronously (at most
            # once a second while idle); closing them makes them flush on exit.
            rt.db.engine.dispose()
            time.sleep(2)
            after = pg_snapshot(pg)
        m = max(len(measured), 1)
        stmts = dict(counter.statements)
        with psycopg.connect(conninfo, autocommit=True) as pg:
            by_status = dict(pg.execute("SELECT status, count(*) FROM messages WHERE id = ANY(%s) GROUP BY status",
                                        (ids,)).fetchall())
            if fake is not None:
                out["fake"] = fake_checks(pg, fake.stats(), ids)
                fake.reset()
        out.update({
            "measured": len(measured), "messages_by_status": by_status,
            "not_sent": sum(v for s, v in by_status.items() if s != "sent") + (k - len(ids)),
            "statements_per_message": round(sum(stmts.values()) / m, 2),
            "statements_by_verb_per_message": {v: round(c / m, 2) for v, c in sorted(stmts.items())},
            "executemany_calls": counter.executemany_calls,
            "pool_checkouts_per_message": round(counter.checkouts / m, 2),
            "pre_ping_selects_per_message": round(counter.checkouts / m, 2) if counter.pre_ping else 0.0,
            "transactions_committed_per_message": round(counter.commits / m, 2),
            # pg_snapshot itself commits once (autocommit): take it off.
            "postgres_commits_per_message": round((after["commits"] - before["commits"] - 1) / m, 2),
            "postgres_wal_kib_per_message": round((after["wal_bytes"] - before["wal_bytes"]) / m / 1024, 2),
            "cpu_ms_per_message": round(1000 * cpu / m, 2), "wall_ms_per_message": round(1000 * wall / m, 2),
            "postgresql_cpu_ms_per_message": round(1000 * pg_cpu / m, 2),
            "fake_cpu_ms_per_message": round(1000 * ((fake.cpu_seconds() if fake else 0.0) - fake_cpu0) / m, 3),
            "one_thread_messages_per_s": round(m / max(wall, 1e-9), 1),
        })
    finally:
        install(previous)
        rt.close()
    return out


def probe_body(args: argparse.Namespace, database_url: str, secret_keys: str, fake: FakeProcess) -> dict[str, Any]:
    """The body and path of one real send, for the bare wire before the drain: the first pending
    reminder, rendered by the engine and posted by its provider to the fake, in this process, with
    a `probe-` reference. Nothing in the database changes; the fake forgets the probe after."""
    from dataclasses import replace

    from sqlalchemy import select

    from engine.tenants.channels import default_channel
    from engine.core.config import Settings
    from engine.store.models import appointments, contacts, messages, orgs
    from engine.store.runtime import Runtime
    from engine.messaging.templates import render_message

    settings = Settings.from_env({**engine_env(args, database_url, secret_keys), "BROKER_URL": "stub://"})
    rt = Runtime.build(settings)
    try:
        with rt.db.connect() as conn:
            msg = conn.execute(select(messages).where(messages.c.status == "pending")
                               .order_by(messages.c.id).limit(1)).one()
            org = conn.execute(select(orgs).where(orgs.c.id == msg.org_id)).one()
            contact = conn.execute(select(contacts).where(contacts.c.org_id == msg.org_id,
                                                          contacts.c.id == msg.contact_id)).one()
            appointment = conn.execute(select(appointments).where(appointments.c.org_id == msg.org_id,
                                                                  appointments.c.id == msg.appointment_id)).one()
            channel = default_channel(conn, msg.org_id, msg.channel_kind)
            rendered = render_message(conn, org=org, contact=contact, appointment=appointment, message=msg)
        rt.providers.get(channel).send(replace(rendered.outbound, reference=f"probe-{msg.id}"))
    finally:
        rt.close()
    stats = fake.stats()
    fake.reset()
    return {"sample_body": stats["sample_body"], "sample_path": stats["sample_path"]}


def measure_wire(args: argparse.Namespace, fake: FakeProcess, fake_stats: dict[str, Any],
                 client: str = "requests") -> dict[str, Any]:
    """The bare `client` baseline (bench/wire.py) against the same fake: the same W processes,
    each with as many threads as a worker process has provider calls in flight."""
    from wire import run_wire

    url = f"http://127.0.0.1:{fake.port}{fake_stats['sample_path']}"
    machine0, fake0 = psutil.cpu_times(), fake.cpu_seconds()
    wall0 = time.monotonic()
    out = run_wire(url, fake_stats["sample_body"], processes=args.workers, threads=calls_in_flight(args),
                   seconds=args.wire_seconds, client=client)
    wall = time.monotonic() - wall0
    machine1 = psutil.cpu_times()
    busy = sum(getattr(machine1, f) - getattr(machine0, f) for f in ("user", "system", "nice", "irq", "softirq",
                                                                    "steal") if hasattr(machine1, f))
    seen = fake.stats()
    fake.reset()
    out["fake_cpu_ms_per_request"] = round(1000 * (fake.cpu_seconds() - fake0) / max(out["sent"], 1), 3)
    out["fake_counted"] = sum(v for k, v in seen["references"].items() if k.startswith("wire-"))
    # Includes process start-up; a rough figure of how busy the machine was during the baseline.
    out["machine_busy_pct"] = round(100 * busy / (wall * (os.cpu_count() or 1)), 1)
    out["body_bytes"] = len(json.dumps(fake_stats["sample_body"]))
    return out


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------


def _print_summary(report: dict[str, Any]) -> None:
    m, pop = report["machine"], report["populate"]
    code = report.get("code", {})
    load = report["load"]
    lines = ["", f"=== Lembra throughput benchmark (commit {code.get('commit')}"
             + (", engine files modified" if code.get("engine_dirty") else "") + ")",
             f"machine    {m['nproc']} CPU {m['cpu_model']}, {m['memory_gib']} GiB RAM, kernel {m['kernel']}, "
             f"load before {m['loadavg_before']}",
             f"software   Python {m['python']}, {m['postgresql']} "
             f"(shared_buffers {m['postgresql_settings'].get('shared_buffers')}, synchronous_commit "
             f"{m['postgresql_settings'].get('synchronous_commit')}, autovacuum "
             f"{m['postgresql_settings'].get('autovacuum')}), Redis {m['redis']}",
             f"data       {load['appointments']:,} appointments x {len(load['rules_offset_minutes'])} rule(s) "
             f"{load['rules_offset_minutes']} min before, {load['contacts']:,} contacts, {load['orgs']} orgs, "
             f"provider {load.get('provider', 'sandbox')}",
             f"populate   {pop['seconds']:.1f}s = {pop['appointments_per_s']:,.0f} appointments/s "
             f"(created {pop['created']:,}, planned {pop['planned']:,}, skipped {pop['skipped']:,}; CPU "
             f"{pop['python_cpu_seconds']}s Python + {pop['postgresql_cpu_seconds']}s PostgreSQL); "
             f"repeat full pass {pop['repeat_pass_seconds']:.1f}s, incremental pass "
             f"{pop['incremental_pass_seconds']:.2f}s"]
    bare = pop.get("bare_write")
    if bare and bare["full_seconds"]:
        lines.append(f"bare write the same {bare['rows']:,} reminders and their events alone, INSERT ... SELECT from a "
                     f"copy into the emptied tables, {bare['connections']} connection(s), every index and foreign "
                     f"key: mean {bare['full_mean_seconds']:.1f}s of {len(bare['full_seconds'])} full writes "
                     f"({', '.join(f'{x:.1f}' for x in bare['full_seconds'])}s; spread {bare['full_spread_seconds']}s; "
                     f"PostgreSQL CPU mean {bare['full_mean_postgresql_cpu_seconds']}s); populate took "
                     f"{bare['populate_over_full']:.2f}x it")
    if bare and bare["variants"]:
        lines.append("account    cost = the full writes on either side minus the variant (wall s; PostgreSQL CPU s)")
        lines.append(f"           {'variant':<34} {'seconds':>14} {'cost s':>14} {'of full':>8} {'of populate':>11} "
                     f"{'CPU cost':>8}  what it leaves out")
        for v in bare["variants"]:
            lines.append(f"           {v['variant']:<34} {'/'.join(f'{x:.1f}' for x in v['seconds']):>14} "
                         f"{'/'.join(f'{x:.1f}' for x in v['cost_seconds']):>14} "
                         f"{v['cost_share_of_reference']:>8.1%} {v['cost_share_of_populate']:>11.1%} "
                         f"{v['cost_cpu_mean_seconds']:>8.1f}  {v['label']}")
    send = report.get("send")
    if send:
        a = report["args"]
        lines.append(f"workers    {a['workers']} process(es) x {a['threads']} threads ({a['worker_layout']}), "
                     f"dispatch interval {a['dispatch_interval']}s"
                     + (f", steady rate {a['rate']}/s for {a['duration']}s" if a.get("rate") else ""))
        if send.get("sent"):
            lat = send["lateness_s"]
            lines += [
                f"sent       {send['sent']:,} ({send['messages_per_s_first_to_last_sent']:,.0f} msg/s first->last sent, "
                f"{send['messages_per_s_from_dispatch_start']:,.0f} msg/s from dispatch start; "
                f"per-second median {send['per_second_median']}, max {send['per_second_max']})",
                f"lateness   p50 {lat['p50']}s, p95 {lat['p95']}s, p99 {lat['p99']}s, max {lat['max']}s"
                + (f"  (goal p99 <= 1 s: {'met' if lat['p99'] <= 1 else 'NOT met'})" if a.get("rate") else ""),
            ]
        checks = (f"checks     not sent {send['not_sent']} {send['messages_by_status']}, sent without a 'sent' event "
                  f"{send.get('sent_without_sent_event')}")
        if send.get("duplicate_idempotency_keys") is not None:
            checks += (f", duplicate sandbox keys {send['duplicate_idempotency_keys']}, sent without sandbox row "
                       f"{send['sent_without_sandbox_row']}")
        fake = send.get("fake")
        if fake:
            checks += (f"; fake: {fake['fake_references']:,} references, duplicates {fake['duplicates']}, "
                       f"sent never seen {fake['sent_never_seen_by_fake']}, seen not sent "
                       f"{fake['seen_by_fake_not_sent']}, refused {fake['refused_by_fake']}")
        lines.append(checks + (", TIMED OUT" if send.get("timed_out") else ""))
        lines.append(f"events     {send.get('message_events_by_kind')}")
        res = report["resources"]
        lines.append(f"worker RSS peak per process {res['worker_peak_rss_mib_max']} MiB "
                     f"(all worker processes {res['worker_peak_rss_mib_sum']} MiB); growth 25%->100% of the drain "
                     f"{res.get('worker_rss_growth_mib_25_to_100')} MiB")
        for pct, values in res.get("worker_rss_mib_at_drain_pct", {}).items():
            lines.append(f"           at {pct:>4} sent: " + ", ".join(f"{v} MiB" for v in values.values()))
        for name, proc in res["processes"].items():
            lines.append(f"           {name}: peak {proc['peak_rss_mib']} MiB, CPU {proc['cpu_s']}s")
        lines.append(f"CPU        machine {res['machine_cpu_busy_pct']}% busy "
                     f"({res['machine_cpu_busy_s']}s of {res['machine_cpu_capacity_s']}s); by group (s): "
                     + ", ".join(f"{k} {v}" for k, v in sorted(res["cpu_seconds_by_group"].items()))
                     + f"; this script {res.get('bench_cpu_s')}, other jobs {res['other_cpu_s']}")
        lines.append("CPU share  of the machine: " + ", ".join(
            f"{k} {v}%" for k, v in sorted(res["cpu_pct_of_machine_by_group"].items()))
            + f", this script {res.get('bench_cpu_pct')}%, other jobs {res['other_cpu_pct']}%, "
            f"idle {res['machine_idle_pct']}%")
        lines.append("CPU/msg    " + ", ".join(f"{k} {v} ms" for k, v in sorted(res["cpu_ms_per_message"].items()))
                     + f"; total {res['cpu_ms_per_message_total']} ms -> at most "
                     f"{res['ceiling_messages_per_s_dedicated_cores']:,.0f} msg/s on {m['nproc']} dedicated cores")
        by_client = res.get("postgresql_cpu_ms_per_message_by_client")
        if by_client:
            lines.append("           postgresql by whose work it did: "
                         + ", ".join(f"{k} {v} ms" for k, v in by_client.items()))
        pg = report.get("postgres")
        if pg:
            lines.append(f"postgres   per message: {pg['commits_per_message']} commits, {pg['wal_kib_per_message']} KiB WAL (cluster-wide), "
                         f"{pg['messages_updates_per_message']} updates of `messages` "
                         f"({pg['messages_hot_update_pct']}% HOT), {pg['tuples_inserted_per_message']} rows inserted")
        inline = report.get("inline")
        if inline:
            lines.append(f"in-process {inline['measured']:,} messages via {inline['entry_point']} in batches of "
                         f"{inline['send_batch']}: {inline['statements_per_message']} statements/message (counted) "
                         f"{inline['statements_by_verb_per_message']} + {inline.get('pre_ping_selects_per_message')} "
                         f"pre-ping SELECT 1, {inline['transactions_committed_per_message']} "
                         f"transactions, {inline['postgres_commits_per_message']} commits seen by PostgreSQL")
            lines.append(f"           {inline['cpu_ms_per_message']} ms CPU + {inline['postgresql_cpu_ms_per_message']} "
                         f"ms PostgreSQL CPU, {inline['wall_ms_per_message']} ms wall per message -> "
                         f"{inline['one_thread_messages_per_s']}/s on one thread; {inline['postgres_wal_kib_per_message']} "
                         f"KiB WAL (cluster-wide); not sent {inline['not_sent']}"
                         + (f"; fake duplicates {inline['fake']['duplicates']}, lost "
                            f"{inline['fake']['sent_never_seen_by_fake'] + inline['fake']['seen_by_fake_not_sent']}"
                            if inline.get("fake") else ""))
        for key, goal in (("wire", " (goal >= 60%)"), ("wire_urllib3", " (the client the engine uses)")):
            wire = report.get(key)
            if not wire:
                continue
            before = wire.get("before")
            if before:
                lines.append(f"bare wire  {wire.get('client', 'requests')} {wire['processes']} x {wire['threads']} threads, "
                             f"{wire['seconds']:.0f}s before the drain and {wire['seconds']:.0f}s after it: "
                             f"{before['messages_per_s']:,.0f} and {wire['after_messages_per_s']:,.0f} req/s, mean "
                             f"{wire['messages_per_s']:,.0f} ({before['errors'] + wire['errors']} errors; client "
                             f"{before['client_cpu_ms_per_request']} and {wire['after_client_cpu_ms_per_request']} ms "
                             f"CPU/request, fake {wire['fake_cpu_ms_per_request']} ms)")
                lines.append(f"           Lembra = {100 * wire['lembra_fraction_of_wire']:.1f}% of the mean{goal} "
                             f"({100 * wire['lembra_fraction_of_wire_before']:.1f}% of the wire before, "
                             f"{100 * wire['lembra_fraction_of_wire_after']:.1f}% of the wire after)")
                continue
            lines.append(f"bare wire  {wire.get('client', 'requests')} {wire['processes']} x {wire['threads']} threads, "
                         f"{wire['seconds']:.0f}s: {wire['messages_per_s']:,.0f} req/s ({wire['errors']} errors; client "
                         f"{wire['client_cpu_ms_per_request']} ms CPU/request, fake {wire['fake_cpu_ms_per_request']} ms; "
                         f"machine {wire['machine_busy_pct']}% busy)")
            lines.append(f"           Lembra = {100 * wire['lembra_fraction_of_wire']:.1f}% of this bare wire{goal}")
        spy = report.get("py_spy")
        if spy:
            lines.append(f"py-spy     {spy['samples']} samples of one worker, self time by library: "
                         + ", ".join(f"{k} {v}%" for k, v in spy["self_by_library_pct"][:8]))
    print("\n".join(lines), flush=True)


def _print_scale(runs: list[dict[str, Any]]) -> None:
    """One row per worker-process count, with each component's share of the machine."""
    if not runs:
        return
    header = ("| workers x threads | sent | msg/s | bare wire (mean of before and after) | % of wire | lateness p50 / p99 | CPU ms/msg total | "
              "workers % | PostgreSQL % | scheduler % | fake % | other jobs % | idle % | statements/msg | "
              "commits/msg |")
    lines = ["", "=== scale", header, "|" + " --- |" * (header.count("|") - 1)]
    for r in runs:
        send, res = r.get("send"), r.get("resources")
        if not send or not res:
            lines.append(f"| {r['args']['workers']} x {r['args']['threads']} | (did not finish) |")
            continue
        share = res["cpu_pct_of_machine_by_group"]
        lat = send.get("lateness_s") or {}
        wire = r.get("wire") or {}
        inline = r.get("inline") or {}
        pg_share = share.get("postgresql", 0) + share.get("postgresql-shared", 0)
        lines.append(
            f"| {r['args']['workers']} x {r['args']['threads']} | {send['sent']:,} | "
            f"{send.get('messages_per_s_first_to_last_sent', 0):,.0f} | {wire.get('messages_per_s', 0):,.0f} | "
            f"{100 * wire.get('lembra_fraction_of_wire', 0):.1f} | {lat.get('p50')} / {lat.get('p99')} s | "
            f"{res['cpu_ms_per_message_total']} | {share.get('worker', 0)} | {pg_share:.1f} | "
            f"{share.get('scheduler', 0)} | {share.get('http_fake', 0)} | {res['other_cpu_pct']} | "
            f"{res['machine_idle_pct']} | {inline.get('statements_per_message', '-')} | "
            f"{r.get('postgres', {}).get('commits_per_message', '-')} |")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
