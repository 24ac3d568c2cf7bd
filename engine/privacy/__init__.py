"""Privacy law (LGPD) and consent: opt-outs that follow the person's address (`addresses`),
retention of old rows (`retention`), erasure of one contact (`erasure`) and the consent-evidence
export of one contact (`consent`). Everything is scoped to one org; nothing here logs an address."""
