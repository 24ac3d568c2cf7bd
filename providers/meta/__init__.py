"""Provider package (implemented in the providers issue)."""
