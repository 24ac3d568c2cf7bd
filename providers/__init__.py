"""Provider implementations: each folder knows one provider's HTTP API and wire formats."""
