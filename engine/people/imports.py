"""CSV import of appointments (and their contacts) for one org.

`import_appointments(db_or_conn, org_id, source)` reads a clinic's spreadsheet export and upserts,
within the org only, contacts by `contact_external_id` and appointments by `external_id`:

- the whole file is parsed and every row validated (required fields, date, phone, e-mail,
  status, mode, consent kinds, external_id repeated in the file) before anything is written;
  a bad row is reported by line number (the header is line 1) with a short pt-BR reason that
  never repeats the row's values (names and phones are personal data), and writes nothing;
- good rows are written in batches of `BATCH` rows, each in its own transaction when given a
  `Database` (inside the caller's transaction, under savepoints, when given a `Connection`);
- a moved appointment is rescheduled, a `cancelado` status cancels as the clinic, consent given
  in the file never overrides a patient's own opt-out;
- reminders follow from ONE set-based `populate_org` pass at the end (not one per row); a past
  appointment is recorded, and populate simply plans nothing (or a skipped reminder) for it.

Values are stored as text, never evaluated: a cell starting with `=` is just a string here (the
console's CSV export and HTML escape them on the way out).
"""

from __future__ import annotations

import csv
import functools
import io
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any
from zoneinfo import ZoneInfo

from sqlalchemy import insert, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from engine.people import appointments as appts
from engine.core import clock
from engine.people.contacts import set_consent
from engine.store.db import Database
from engine.core.errors import DomainError
from engine.store.models import APPOINTMENT_STATUSES, CHANNEL_KINDS, appointments, contacts, orgs, preferences
from engine.reminders.populate import DEFAULT_HORIZON, populate_org
from engine.queue import address_optouts as addresses
from engine.words.texts import N_, Text
from gateway.phones import InvalidPhone, normalize_phone

#: Biggest file accepted (bytes) and most data rows; beyond them the whole file is refused.
MAX_BYTES = 5 * 1024 * 1024
MAX_ROWS = 50_000
#: Rows written per transaction.
BATCH = 500
#: Evidence recorded with consent given in an import.
EVIDENCE = "importação CSV"
#: Reason given for a row that a concurrent change made impossible to write.
CONFLICT_REASON = N_("não foi possível gravar esta linha (conflito com outra alteração); importe-a de novo")
#: Longest value accepted in one cell.
MAX_CELL = 300
#: Warning for a row whose patient's phone or e-mail was refused by a patient (SAIR, unsubscribe).
OPTED_OUT_ADDRESS = N_("o telefone ou o e-mail deste paciente pediu para não receber mensagens; nada será enviado "
                       "a ele por %(canais)s")

COLUMNS = ("external_id", "contact_external_id", "contact_name", "phone", "email", "starts_at",
           "professional", "mode", "location", "status", "consent")
REQUIRED_COLUMNS = ("external_id", "contact_external_id", "contact_name", "starts_at")
#: A line the upload page shows as an example (delimiter `;`, as pt-BR Excel writes it).
EXAMPLE_HEADER = ";".join(COLUMNS)
EXAMPLE_LINE = ("AG-1001;PAC-77;Ana Clara Souza;(16) 99988-7766;ana@example.com;03/12/2026 14:30;"
                "Dra. Beatriz Costa;presencial;Sala 2;agendado;whatsapp|email")

COLUMN_LABELS = {
    "external_id": N_("ID do agendamento"), "contact_external_id": N_("ID do paciente"),
    "contact_name": N_("nome do paciente"), "starts_at": N_("data e hora"),
}
_STATUS_ALIASES = {
    "agendado": "scheduled", "confirmado": "confirmed", "cancelado": "cancelled", "realizado": "completed",
    "faltou": "no_show", **{s: s for s in APPOINTMENT_STATUSES},
}
_MODE_ALIASES = {"presencial": "in_person", "in_person": "in_person", "online": "online", "on-line": "online",
                 "teleconsulta": "online"}
_KIND_ALIASES = {"e-mail": "email", "mail": "email", "whats": "whatsapp", "zap": "whatsapp",
                 **{k: k for k in CHANNEL_KINDS}}
_BR_DATETIME = re.compile(r"^(\d{1,2})/(\d{1,2})/(\d{4})[ T]+(\d{1,2}):(\d{2})(?::(\d{2}))?$")

Source = str | bytes | IO[str] | IO[bytes]


class ImportFileError(DomainError):
    """The whole file is refused (too big, not CSV, missing columns); `text` says why, translatable."""

    def __init__(self, text: Text) -> None:
        super().__init__(str(text))
        self.text = text


@dataclass
class ImportReport:
    """What one import did. `errors` are (line number, reason), line 1 being the header;
    `warnings` (line number, reason) are rows that were written but will not be messaged."""

    created: int = 0
    updated: int = 0
    unchanged: int = 0
    errors: list[tuple[int, Text]] = field(default_factory=list)
    warnings: list[tuple[int, Text]] = field(default_factory=list)
    contacts_created: int = 0
    contacts_updated: int = 0
    reminders_created: int = 0
    rows: int = 0
    seconds: float = 0.0
    populate_seconds: float = 0.0

    @property
    def imported(self) -> int:
        return self.created + self.updated + self.unchanged

    def counts(self) -> dict[str, Any]:
        """Counts only (for the audit log): no values from the file."""
        return {"rows": self.rows, "created": self.created, "updated": self.updated, "unchanged": self.unchanged,
                "errors": len(self.errors), "warnings": len(self.warnings), "contacts_created": self.contacts_created,
                "contacts_updated": self.contacts_updated, "reminders_created": self.reminders_created}


@dataclass
class _Row:
    line: int
    external_id: str
    contact_external_id: str
    contact_name: str
    phone: str | None
    email: str | None
    starts_at: datetime
    professional: str | None
    mode: str | None
    location: str | None
    status: str | None
    consent: tuple[str, ...]


class _RowError(Exception):
    def __init__(self, text: Text) -> None:
        super().__init__(str(text))
        self.text = text


@dataclass
class _Tally:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    contacts_created: int = 0
    contacts_updated: int = 0
    errors: list[tuple[int, Text]] = field(default_factory=list)
    warnings: list[tuple[int, Text]] = field(default_factory=list)

    def add_to(self, report: ImportReport) -> None:
        report.created += self.created
        report.updated += self.updated
        report.unchanged += self.unchanged
        report.contacts_created += self.contacts_created
        report.contacts_updated += self.contacts_updated
        report.errors.extend(self.errors)
        report.warnings.extend(self.warnings)


# --- entry point ----------------------------------------------------------------------------------

def import_appointments(target: Database | Connection, org_id: int, source: Source) -> ImportReport:
    """Import the CSV `source` (text, bytes or a stream) into org `org_id`; see the module doc.

    Raises ImportFileError when the file as a whole is refused (nothing is written then)."""
    started = time.perf_counter()
    raw = _read(source)
    report = ImportReport()
    if isinstance(target, Database):
        with target.connect() as conn:
            tz_name = _org_timezone(conn, org_id)
    else:
        tz_name = _org_timezone(target, org_id)
    rows = _parse(raw, ZoneInfo(tz_name), report)
    changed = 0
    try:
        for start in range(0, len(rows), BATCH):
            batch = rows[start:start + BATCH]
            if isinstance(target, Database):
                with target.begin() as conn:
                    _declare(conn, org_id)
                    _write_batch(conn, org_id, tz_name, batch, report)
            else:
                _write_batch(target, org_id, tz_name, batch, report)
            changed = report.created + report.updated + report.contacts_created + report.contacts_updated
    finally:
        if changed:  # even after a failure, what was committed gets its reminders now
            populate_started = time.perf_counter()
            if isinstance(target, Database):
                with target.begin() as conn:
                    _declare(conn, org_id)
                    report.reminders_created = populate_org(conn, org_id, horizon=DEFAULT_HORIZON).created
            else:
                report.reminders_created = populate_org(target, org_id, horizon=DEFAULT_HORIZON).created
            report.populate_seconds = time.perf_counter() - populate_started
    report.errors.sort(key=lambda error: error[0])
    report.warnings.sort(key=lambda warning: warning[0])
    report.seconds = time.perf_counter() - started
    return report


def _declare(conn: Connection, org_id: int) -> None:
    """On PostgreSQL, row-level security backs up every query's own org filter."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT set_config('lembra.org_id', :o, true)"), {"o": str(org_id)})


def _org_timezone(conn: Connection, org_id: int) -> str:
    tz = conn.execute(select(orgs.c.timezone).where(orgs.c.id == org_id)).scalar_one_or_none()
    if tz is None:
        raise DomainError("no such org")
    return str(tz)


# --- reading and validating -----------------------------------------------------------------------

def _read(source: Source) -> str:
    if hasattr(source, "read"):
        data = source.read(MAX_BYTES + 1)  # type: ignore[union-attr]
    else:
        data = source
    size = len(data.encode("utf-8")) if isinstance(data, str) else len(data)
    if size > MAX_BYTES:
        raise ImportFileError(N_("Arquivo grande demais: o limite é %(mb)d MB (%(linhas)d linhas). Divida-o em partes.",
                                 mb=MAX_BYTES // (1024 * 1024), linhas=MAX_ROWS))
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            # Excel in pt-BR saves "CSV (separado por vírgulas)" as Windows-1252.
            data = data.decode("cp1252", errors="replace")
    if "\x00" in data:
        raise ImportFileError(N_("O arquivo não parece ser um CSV de texto (UTF-8)."))
    return data.lstrip("\ufeff")


def _parse(raw: str, tz: ZoneInfo, report: ImportReport) -> list[_Row]:
    header_line = next((ln for ln in raw.splitlines() if ln.strip()), "")
    if not header_line:
        raise ImportFileError(N_("O arquivo está vazio."))
    delimiter = ";" if header_line.count(";") > header_line.count(",") else ","
    reader = csv.reader(io.StringIO(raw, newline=""), delimiter=delimiter)
    try:
        header: list[str] = []
        while not any(c.strip() for c in header):
            header = next(reader)
        names = [h.strip().lstrip("\ufeff").lower() for h in header]
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise ImportFileError(N_("Faltam colunas no cabeçalho: %(faltam)s. Colunas aceitas: %(aceitas)s.",
                                     faltam=", ".join(missing), aceitas=", ".join(COLUMNS)))
        repeated = sorted({n for n in names if n and names.count(n) > 1})
        if repeated:
            raise ImportFileError(N_("Coluna repetida no cabeçalho: %(colunas)s.", colunas=", ".join(repeated)))
        index = {n: i for i, n in enumerate(names) if n in COLUMNS}
        rows: list[_Row] = []
        seen: dict[str, int] = {}
        previous_end = reader.line_num
        for cells in reader:
            line, previous_end = previous_end + 1, reader.line_num
            if not any(c.strip() for c in cells):
                continue
            report.rows += 1
            if report.rows > MAX_ROWS:
                raise ImportFileError(N_("Linhas demais: o limite é %(linhas)d por arquivo. Divida-o em partes.",
                                         linhas=MAX_ROWS))
            try:
                if len(cells) > len(names) and any(c.strip() for c in cells[len(names):]):
                    raise _RowError(N_("%(n)d colunas, mas o cabeçalho tem %(m)d", n=len(cells), m=len(names)))
                row = _validate(line, {n: (cells[i].strip() if i < len(cells) else "") for n, i in index.items()}, tz)
                first = seen.get(row.external_id)
                if first is not None:
                    raise _RowError(N_("external_id repetido no arquivo (já usado na linha %(linha)d)", linha=first))
                seen[row.external_id] = line
                rows.append(row)
            except _RowError as exc:
                report.errors.append((line, exc.text))
    except csv.Error:
        raise ImportFileError(N_("CSV malformado perto da linha %(linha)d (aspas sem fechar?).",
                                 linha=reader.line_num)) from None
    return rows


def _validate(line: int, v: dict[str, str], tz: ZoneInfo) -> _Row:
    for name, value in v.items():
        if len(value) > MAX_CELL:
            raise _RowError(N_("%(coluna)s longo demais (máximo %(max)d caracteres)", coluna=name, max=MAX_CELL))
    for name in REQUIRED_COLUMNS:
        if not v.get(name):
            raise _RowError(N_("%(coluna)s em branco (%(nome)s é obrigatório)", coluna=name, nome=COLUMN_LABELS[name]))
    phone = v.get("phone") or None
    if phone:
        try:
            phone = _normalize_phone(phone)
        except InvalidPhone:
            raise _RowError(N_("telefone inválido (use DDD e número, ex.: (16) 99988-7766)")) from None
    email = (v.get("email") or "").lower() or None
    if email and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
        raise _RowError(N_("e-mail inválido"))
    status = None
    if v.get("status"):
        status = _STATUS_ALIASES.get(v["status"].lower())
        if status is None:
            raise _RowError(N_("status desconhecido (use agendado, confirmado, cancelado, realizado ou faltou)"))
    mode = None
    if v.get("mode"):
        mode = _MODE_ALIASES.get(v["mode"].lower())
        if mode is None:
            raise _RowError(N_("modalidade desconhecida (use presencial ou online)"))
    consent: list[str] = []
    for part in re.split(r"[|/+ ]+", (v.get("consent") or "").lower()):
        if not part:
            continue
        kind = _KIND_ALIASES.get(part)
        if kind is None:
            raise _RowError(N_("consentimento com canal desconhecido (use whatsapp, sms, email separados por |)"))
        if kind not in consent:
            consent.append(kind)
    return _Row(
        line=line, external_id=v["external_id"], contact_external_id=v["contact_external_id"],
        contact_name=v["contact_name"], phone=phone, email=email, starts_at=_parse_start(v["starts_at"], tz),
        professional=v.get("professional") or None, mode=mode, location=v.get("location") or None,
        status=status, consent=tuple(consent),
    )


@functools.lru_cache(maxsize=4096)
def _normalize_phone(raw: str) -> str:
    return normalize_phone(raw)


def _parse_start(value: str, tz: ZoneInfo) -> datetime:
    match = _BR_DATETIME.match(value)
    try:
        if match:
            d, mo, y, h, mi, s = match.groups()
            parsed = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s or 0), tzinfo=tz)
        else:
            parsed = datetime.fromisoformat(value.replace(" ", "T", 1) if re.match(r"^\d{4}-", value) else value)
    except ValueError:
        raise _RowError(N_("starts_at inválido (use dd/mm/aaaa hh:mm ou ISO 8601 com fuso, ex.: "
                           "2026-12-03T14:30-03:00)")) from None
    if parsed.tzinfo is None:
        raise _RowError(N_("starts_at em ISO 8601 sem fuso horário (acrescente -03:00, ou use dd/mm/aaaa hh:mm)"))
    if not 2000 <= parsed.year <= 2100:
        raise _RowError(N_("starts_at fora do intervalo aceito (anos 2000 a 2100)"))
    return parsed


# --- writing --------------------------------------------------------------------------------------

def _write_batch(conn: Connection, org_id: int, tz_name: str, batch: list[_Row], report: ImportReport) -> None:
    """Write one batch under a savepoint; if something unexpected fails (a concurrent writer took
    an external_id, say), redo the batch row by row so only the failing rows are lost."""
    tally = _Tally()
    try:
        with conn.begin_nested():
            _write_rows(conn, org_id, tz_name, batch, tally)
    except (SQLAlchemyError, DomainError):
        tally = _Tally()
        for row in batch:
            try:
                with conn.begin_nested():
                    _write_rows(conn, org_id, tz_name, [row], tally)
            except (SQLAlchemyError, DomainError):  # never the driver's text: it may quote the values
                tally.errors.append((row.line, CONFLICT_REASON))
    tally.add_to(report)


class _State:
    """The batch's existing contacts (with consent) and appointments, fetched once."""

    def __init__(self, conn: Connection, org_id: int, batch: list[_Row]) -> None:
        contact_ids = sorted({r.contact_external_id for r in batch})
        appt_ids = sorted({r.external_id for r in batch})
        self.contacts: dict[str, Any] = {
            row.external_id: row for row in conn.execute(select(contacts).where(
                contacts.c.org_id == org_id, contacts.c.external_id.in_(contact_ids)))
        }
        self.prefs: dict[tuple[int, str], Any] = {}
        ids = [c.id for c in self.contacts.values()]
        if ids:
            for p in conn.execute(select(preferences.c.contact_id, preferences.c.kind, preferences.c.opted_in,
                                         preferences.c.opted_out_at)
                                  .where(preferences.c.org_id == org_id, preferences.c.contact_id.in_(ids))):
                self.prefs[(p.contact_id, p.kind)] = p
        self.appointments: dict[str, Any] = {
            row.external_id: row for row in conn.execute(select(appointments).where(
                appointments.c.org_id == org_id, appointments.c.external_id.in_(appt_ids)))
        }


def _write_rows(conn: Connection, org_id: int, tz_name: str, batch: list[_Row], tally: _Tally) -> None:
    """Rows in file order. New contacts, their consent and new appointments are inserted set-wise
    (one multi-row INSERT each per batch, with the same normalised values and checks as
    engine.people.contacts.create_contact / engine.people.appointments.create_appointment); existing rows go
    through the engine's update functions (reschedule, cancel, confirm, set_consent)."""
    state = _State(conn, org_id, batch)
    now = clock.now()
    accepted: list[_Row] = []
    new_contacts: dict[str, dict[str, Any]] = {}
    new_consent: dict[str, list[str]] = {}
    # 1. checks against what is stored, before anything of the row is written
    for row in batch:
        contact = state.contacts.get(row.contact_external_id)
        existing = state.appointments.get(row.external_id)
        if contact is not None and contact.erased_at is not None:
            tally.errors.append((row.line, N_("paciente apagado a pedido (LGPD); não recebe novos agendamentos")))
            continue
        if existing is not None and (contact is None or existing.contact_id != contact.id):
            tally.errors.append((row.line, N_("este agendamento já pertence a outro paciente")))
            continue
        accepted.append(row)
        if contact is None:  # later rows of the same new patient: their values win, consent adds up
            values = new_contacts.setdefault(row.contact_external_id, {
                "org_id": org_id, "external_id": row.contact_external_id, "name": None, "phone": None,
                "email": None, "locale": None, "created_at": now, "updated_at": now})
            values["name"] = row.contact_name
            values["phone"] = row.phone or values["phone"]
            values["email"] = row.email or values["email"]
            kinds = new_consent.setdefault(row.contact_external_id, [])
            kinds.extend(k for k in row.consent if k not in kinds)
    # 2. new contacts and their consent
    if new_contacts:
        for r in conn.execute(insert(contacts).returning(contacts.c.id, contacts.c.external_id),
                              list(new_contacts.values())):
            state.contacts[r.external_id] = r
        prefs = [{"org_id": org_id, "contact_id": state.contacts[ext].id, "kind": kind, "opted_in": True,
                  "opted_in_at": now, "opted_out_at": None, "source": "clinic", "evidence": EVIDENCE,
                  "updated_at": now}
                 for ext, kinds in new_consent.items() for kind in kinds]
        if prefs:
            conn.execute(insert(preferences), prefs)
        tally.contacts_created += len(new_contacts)
    # 3. existing contacts and appointments, in file order; new appointments set-wise
    updated_contacts: set[str] = set()
    new_appointments: list[dict[str, Any]] = []
    # Patients whose phone or e-mail is new here: the line that brought it, and the addresses.
    arrived: dict[str, tuple[int, list[addresses.Address]]] = {}
    for row in accepted:
        contact = state.contacts[row.contact_external_id]
        if row.contact_external_id in new_contacts:
            values = new_contacts[row.contact_external_id]
            arrived.setdefault(row.contact_external_id,
                               (row.line, addresses.addresses_of(values["phone"], values["email"])))
        elif _update_contact(conn, org_id, contact, row, state):
            updated_contacts.add(row.contact_external_id)
            fresh = state.contacts[row.contact_external_id] = conn.execute(
                select(contacts).where(contacts.c.id == contact.id)).one()
            if (fresh.phone, fresh.email) != (contact.phone, contact.email):
                arrived[row.contact_external_id] = (row.line, addresses.addresses_of(fresh.phone, fresh.email))
        existing = state.appointments.get(row.external_id)
        if existing is None:
            new_appointments.append({
                "org_id": org_id, "contact_id": contact.id, "starts_at": row.starts_at,
                "professional": row.professional, "timezone": tz_name, "mode": row.mode,
                "location": row.location, "external_id": row.external_id, "status": row.status or "scheduled",
                "created_at": now, "updated_at": now})
        elif _update_appointment(conn, org_id, existing, row):
            tally.updated += 1
        else:
            tally.unchanged += 1
    if new_appointments:
        conn.execute(insert(appointments), new_appointments)
        tally.created += len(new_appointments)
    tally.contacts_updated += len(updated_contacts)
    _warn_refused_addresses(conn, org_id, arrived, tally)


def _warn_refused_addresses(conn: Connection, org_id: int, arrived: dict[str, tuple[int, list[Any]]],
                            tally: _Tally) -> None:
    """A new (or newly addressed) patient whose phone or e-mail some patient refused: written,
    never messaged on those kinds (populate checks the address), and the report says so."""
    every = [address for _, found in arrived.values() for address in found]
    addresses.recognise(conn, org_id, every)  # an erased person's refusal, kept hashed
    refused = addresses.matching(conn, org_id, every)
    for line, found in arrived.values():
        kinds = set().union(*(refused.get(address, set()) for address in found))
        if kinds:
            tally.warnings.append((line, Text(OPTED_OUT_ADDRESS.msgid, {"canais": ", ".join(sorted(kinds))})))


class _Granted:
    opted_in = True
    opted_out_at = None


def _update_contact(conn: Connection, org_id: int, contact: Any, row: _Row, state: _State) -> bool:
    """Fields given in the row (blank cells keep what is stored) and new consent; True if changed."""
    wanted = {k: v for k, v in (("name", row.contact_name), ("phone", row.phone), ("email", row.email))
              if v and v != getattr(contact, k)}
    if wanted:
        conn.execute(update(contacts).where(contacts.c.org_id == org_id, contacts.c.id == contact.id)
                     .values(**wanted, updated_at=clock.now()))
    granted = False
    for kind in row.consent:
        pref = state.prefs.get((contact.id, kind))
        if pref is not None and (pref.opted_in or pref.opted_out_at is not None):
            continue  # already consented, or the patient refused: the patient's word stands
        set_consent(conn, org_id, contact.id, kind, source="clinic", evidence=EVIDENCE)
        state.prefs[(contact.id, kind)] = _Granted
        granted = True
    return bool(wanted) or granted


def _update_appointment(conn: Connection, org_id: int, existing: Any, row: _Row) -> bool:
    """Bring an existing appointment in line with the row; True if anything changed. A new time
    reschedules; `cancelado` cancels as the clinic; `agendado` does not undo a confirmation."""
    plain = {k: v for k, v in (("professional", row.professional), ("mode", row.mode), ("location", row.location))
             if v is not None and v != getattr(existing, k)}
    if not plain and row.starts_at == existing.starts_at and (
            not row.status or row.status == existing.status
            or (row.status == "scheduled" and existing.status == "confirmed")):
        return False
    where = (appointments.c.org_id == org_id) & (appointments.c.id == existing.id)
    now = clock.now()
    changed = False
    if plain:
        conn.execute(update(appointments).where(where).values(**plain, updated_at=now))
        changed = True
    status = existing.status
    if row.starts_at != existing.starts_at:
        if status in appts.LIVE:
            appts.reschedule(conn, org_id, existing.id, row.starts_at)
            status = "scheduled"
        else:
            conn.execute(update(appointments).where(where).values(starts_at=row.starts_at, updated_at=now))
        changed = True
    target = row.status
    if target and target != status and not (target == "scheduled" and status == "confirmed"):
        appts.set_status(conn, org_id, existing.id, status, target)
        changed = True
    return changed
