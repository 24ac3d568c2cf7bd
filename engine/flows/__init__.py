"""Follow-up flows (SPEC §7): one graph, one enrollment, one clock. See docs/flows.md."""
