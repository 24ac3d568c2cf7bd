"""Privacy law (LGPD): retention of old rows (`retention`), erasure of one contact (`erasure`) and
the consent-evidence export of one contact (`consent`). The opt-outs that follow a person's address
are a gate of the outbox (`engine.queue.address_optouts`). Everything is scoped to one org; nothing
here logs an address."""
