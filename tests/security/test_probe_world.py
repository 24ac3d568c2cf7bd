"""The probe world itself: every org table the schema has gets a row in both clinics, so a view or
route added over any of them is probed with real ids (issue 9 acceptance)."""

from __future__ import annotations

from engine.store.models import Base

#: Org tables with no row in the probe world, and why that is fine.
UNSEEDED = {
    "retention_runs": "written by the retention job, shown by no page or route by id",
    "channel_pacing": "the sender's pacing counters, shown by no page or route by id",
}


def test_every_org_table_has_a_row_in_both_clinics(probe):
    missing = []
    for table in Base.metadata.sorted_tables:
        if "org_id" not in table.c or "id" not in table.c or table.name in UNSEEDED:
            continue
        for org in (probe.a, probe.b):
            if table.name not in org.ids:
                missing.append(f"{org.slug}: {table.name}")
    assert not missing, "seed these tables in tests/security/conftest.py (_seed): " + ", ".join(missing)
