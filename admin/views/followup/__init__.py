"""The Acompanhamento menu, the follow-up console (SPEC §8, issue 10): flows and their builder, and
the views of the runs."""
