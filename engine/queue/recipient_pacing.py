"""Fleet-wide spacing of the messages one channel sends to one recipient (Meta refuses more than
about one every 6 s to the same person: error 131056), and the pause of a whole channel that
reached its provider's throughput (Meta 130429).

Per recipient: one `recipient_pacing` row per (channel, recipient) holds the instant the channel
may next send to that person. The recipient is an HMAC of the address under a key derived from
the keyring, so no phone number is stored here. A batch's checks reserve the slots of all their
recipients in ONE statement (`reserve`): an upsert that moves a row's instant forward only when
it has passed, and names the check that moved it, so each check learns from the returned rows
which recipients it may send to now — across every worker process and machine, because the row
is shared (a row lock on PostgreSQL, the write lock on SQLite).

Per channel: the channel's `channel_pacing.next_slot_at` (the row the Evolution pacing keeps) is
pushed forward (`pause_channel`); the checks defer the channel's messages until it has passed.

The slot is reserved at the check and, when the call's wave is marked `sending` more than `LATE`
after it, counted again from then (`late_moves`, written by the wave's statement on PostgreSQL and
by `sending` on SQLite), so a batch whose later waves start seconds after its checks still leaves
the interval (less `LATE` at most) between two calls to one person.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Sequence

from sqlalchemy import and_, bindparam, case, update
from sqlalchemy.engine import Connection

from engine.store.dialect import insert_ignore, insert_rows
from engine.store.models import channel_pacing, recipient_pacing

#: How much later than its check a call may begin before its recipient's slot is counted again
#: from the call (Meta counts its 6 s loosely: it lets a short burst through).
LATE = timedelta(milliseconds=500)
#: The keyring purpose of the recipient hash (its own key: these hashes match no other table's).
HASH_PURPOSE = "recipient-pacing"


@dataclass(frozen=True)
class Want:
    """One message that would go to `recipient` (its hash) on `channel_id`, `interval` after the
    previous one."""

    message_id: int
    org_id: int
    channel_id: int
    recipient: str
    interval: timedelta
    #: When the check reserved the slot (the instant the reservation counts from).
    checked_at: datetime


class RecipientHasher:
    """Keyed hashes of recipients; the key is derived once (HKDF costs more than the HMACs)."""

    def __init__(self, keyring: Any) -> None:
        self._key = keyring.derive(HASH_PURPOSE)

    def __call__(self, org_id: int, channel_id: int, to: str) -> str:
        """The stored name of `to` for this org's channel (hex HMAC-SHA256)."""
        return hmac.new(self._key, f"{org_id}|{channel_id}|{to}".encode(), hashlib.sha256).hexdigest()


def reserve(conn: Connection, wanted: Sequence[Want], now: datetime) -> dict[int, datetime]:
    """Take each recipient's next slot for the first of `wanted` (in order) that goes to them;
    returns, for every message that may NOT go now, the instant to try it again (the recipient's
    next slot, and one interval more for each further message to the same person)."""
    groups: dict[tuple[int, str], list[Want]] = {}
    for want in wanted:
        groups.setdefault((want.channel_id, want.recipient), []).append(want)
    if not groups:
        return {}
    token = uuid.uuid4().hex
    table = recipient_pacing
    # Sorted: two checks (and a wave's `sending`) lock the rows they share in the same order, so
    # they never deadlock.
    rows = [{"channel_id": channel_id, "recipient": recipient, "org_id": group[0].org_id,
             "next_allowed_at": now + group[0].interval, "taken_by": token}
            for (channel_id, recipient), group in sorted(groups.items())]
    # One statement text for any count of recipients (insert_rows): a multi-row VALUES has no
    # cache key and was compiled again for every check (a quarter of a send's CPU, profiled).
    taken = insert_rows(conn, table, rows, on_conflict=_take_free_slots, params={"now": now},
                        returning=(table.c.channel_id, table.c.recipient, table.c.next_allowed_at, table.c.taken_by))
    later: dict[int, datetime] = {}
    for row in taken:
        group = groups[(row.channel_id, row.recipient)]
        waiting = group[1:] if row.taken_by == token else group
        for position, want in enumerate(waiting):
            later[want.message_id] = row.next_allowed_at + want.interval * position
    return later


@dataclass(frozen=True)
class LateMove:
    """A recipient whose next slot is counted again from the call: the row `sending` writes, and
    the messages of the wave that call them (it is written only if one of them became `sending`)."""

    row: dict[str, Any]
    message_ids: tuple[int, ...]


def late_moves(wanted: Sequence[Want], now: datetime) -> list[LateMove]:
    """Of `wanted`, whose calls begin `now`, the recipients of those checked more than `LATE` ago,
    one move per (channel, recipient) in the order `reserve` locks their rows: a batch's later
    waves (or a wait for the write lock) may start seconds after its checks, so their recipients'
    next slots are counted from the call, not from the check that reserved them."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    callers: dict[tuple[int, str], list[int]] = {}
    for want in wanted:
        if now - want.checked_at <= LATE:
            continue
        until = now + want.interval
        key = (want.channel_id, want.recipient)
        callers.setdefault(key, []).append(want.message_id)
        if key not in rows or rows[key]["next_allowed_at"] < until:
            rows[key] = {"channel_id": want.channel_id, "recipient": want.recipient, "org_id": want.org_id,
                         "next_allowed_at": until, "taken_by": "sending"}
    return [LateMove(rows[key], tuple(callers[key])) for key in sorted(rows)]


def sending(conn: Connection, moves: Sequence[LateMove]) -> None:
    """Write `moves` (`late_moves`, of the messages just marked `sending`): one statement, and
    none for a wave marked right after its checks (the common case: a wave's calls take
    milliseconds on a fast provider), so the spacing holds to within `LATE`. PostgreSQL writes
    them in the wave's own statement instead (engine/messaging/dispatch/waves.py)."""
    if not moves:
        return
    # An upsert of the rows in `reserve`'s order rather than an UPDATE: it finds each row by the
    # primary key, whatever plan PostgreSQL keeps for a prepared statement (the UPDATE's generic
    # plan read every row of the wave's channels, 5 ms a wave), and locks them in the order a
    # check does, where the UPDATE locked them in the order it found them and deadlocked with a
    # check (the wave's record rolled back, its calls `unknown`), twice in a 30,000-message drain.
    insert_rows(conn, recipient_pacing, [move.row for move in moves], on_conflict=move_forward)


def push_back(conn: Connection, hasher: RecipientHasher, org_id: int, channel_id: int, to: str,
              until: datetime) -> None:
    """The provider refused a message for its recipient's rate: no send to them before `until`."""
    recipient = hasher(org_id, channel_id, to)
    conn.execute(insert_ignore(conn, recipient_pacing, ("channel_id", "recipient")).values(
        channel_id=channel_id, recipient=recipient, org_id=org_id, next_allowed_at=until, taken_by="provider"))
    conn.execute(update(recipient_pacing).where(
        recipient_pacing.c.channel_id == channel_id, recipient_pacing.c.recipient == recipient,
        recipient_pacing.c.org_id == org_id, recipient_pacing.c.next_allowed_at < until,
    ).values(next_allowed_at=until, taken_by="provider"))


def pause_channel(conn: Connection, org_id: int, channel_id: int, until: datetime) -> None:
    """The provider refused a message for the channel's throughput: none of the channel's
    messages goes before `until` (its `channel_pacing` slot, which every check reads)."""
    conn.execute(insert_ignore(conn, channel_pacing, ("channel_id",)).values(
        channel_id=channel_id, org_id=org_id, next_slot_at=until, day="", sent_today=0))
    conn.execute(update(channel_pacing).where(
        channel_pacing.c.channel_id == channel_id, channel_pacing.c.org_id == org_id,
        channel_pacing.c.next_slot_at < until,
    ).values(next_slot_at=until))


def _take_free_slots(insert: Any) -> Any:
    """`reserve`'s conflict clause: a recipient's row whose instant has passed (`:now`) is taken."""
    table = recipient_pacing
    # SET reads the row as it was: both columns test the old instant.
    free = table.c.next_allowed_at <= bindparam("now", type_=table.c.next_allowed_at.type)
    return insert.on_conflict_do_update(
        index_elements=["channel_id", "recipient"],
        set_={"next_allowed_at": case((free, insert.excluded.next_allowed_at), else_=table.c.next_allowed_at),
              "taken_by": case((free, insert.excluded.taken_by), else_=table.c.taken_by)})


def move_forward(insert: Any) -> Any:
    """`sending`'s conflict clause (and a late wave's on PostgreSQL): a row of this org moves
    forward, never back."""
    table = recipient_pacing
    return insert.on_conflict_do_update(
        index_elements=["channel_id", "recipient"], set_={"next_allowed_at": insert.excluded.next_allowed_at},
        where=and_(table.c.org_id == insert.excluded.org_id,
                   table.c.next_allowed_at < insert.excluded.next_allowed_at))
