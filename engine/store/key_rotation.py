"""Credential key rotation: re-encrypt every sealed column under the newest key, in batches,
so that older keys can then be removed from LEMBRA_SECRET_KEYS."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Table, select, update

from engine.store.db import Database
from engine.store.models import agents, channels, webhook_endpoints
from gateway.crypto import Keyring

#: Every sealed column: (table, ciphertext column).
SEALED = ((channels, "credentials"), (agents, "llm_api_key"), (webhook_endpoints, "secret"))


@dataclass
class RotationResult:
    """Rows re-encrypted per table."""

    rotated: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.rotated.values())


def rotate(db: Database, keyring: Keyring, *, batch: int = 200) -> RotationResult:
    """Re-encrypt rows not sealed with the current key. Each batch is its own transaction and
    each row is a compare-and-set on its key version, so a crash or a second run is harmless."""
    result = RotationResult(rotated={})
    for table, column in SEALED:
        result.rotated[table.name] = _rotate_table(db, keyring, table, column, batch)
    return result


def _rotate_table(db: Database, keyring: Keyring, table: Table, column: str, batch: int) -> int:
    done = 0
    last_id = 0
    current = keyring.current_version
    while True:
        with db.begin() as conn:
            rows = conn.execute(
                select(table.c.id, table.c.org_id, table.c[column], table.c.key_version)
                .where(table.c[column].is_not(None), table.c.key_version != current, table.c.id > last_id)
                .order_by(table.c.id).limit(batch)
            ).all()
            if not rows:
                return done
            for row in rows:
                plain = keyring.open(row[2], key_version=row.key_version, table=table.name,
                                     org_id=row.org_id, row_id=row.id)
                sealed = keyring.seal(plain, table=table.name, org_id=row.org_id, row_id=row.id)
                moved = conn.execute(
                    update(table).where(table.c.id == row.id, table.c.org_id == row.org_id,
                                        table.c.key_version == row.key_version)
                    .values({column: sealed.ciphertext, "key_version": sealed.key_version})
                ).rowcount
                done += moved
            last_id = rows[-1].id
