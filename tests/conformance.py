"""Published provider samples and signature vectors, read from `shared/conformance/` beside the
checkout (they are not copied into the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "conformance"


def sample_path(relative: str) -> Path:
    """Path of a file under shared/conformance/ (e.g. 'samples/meta_whatsapp/webhook_status_read.json')."""
    path = ROOT / relative
    if not path.exists():
        pytest.fail(f"conformance sample missing: {path} (shared/ must sit beside the checkout)")
    return path


def sample_bytes(relative: str) -> bytes:
    """The sample's exact bytes (signatures are over raw bodies)."""
    return sample_path(relative).read_bytes()
