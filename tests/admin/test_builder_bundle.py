"""The committed flow builder bundle matches its sources, without Node: admin/frontend/build.mjs
writes a SHA-256 of the sources (src/**, package.json, package-lock.json, build.mjs) in the first
line of builder.js and builder.css; this recomputes it the same way. Editing a source without
`npm run build` (or building from other sources) fails here; `admin/frontend/check.sh` is the
full rebuild-and-compare that CI runs with Node."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRONTEND = ROOT / "admin" / "frontend"
BUNDLE = ROOT / "admin" / "static" / "flows"
FIRST_LINE = re.compile(r"^/\*! lembra-flow-builder sources-sha256:([0-9a-f]{64}) \*/$")


def sources_hash(frontend: Path = FRONTEND) -> str:
    """sha256 over "<path>\\0<bytes>\\0" of each input, in byte order of the path (as build.mjs)."""
    files = [p.relative_to(frontend).as_posix() for p in (frontend / "src").rglob("*") if p.is_file()]
    files += ["package.json", "package-lock.json", "build.mjs"]
    digest = hashlib.sha256()
    for name in sorted(files, key=lambda n: n.encode()):
        digest.update(name.encode() + b"\0")
        digest.update((frontend / name).read_bytes() + b"\0")
    return digest.hexdigest()


def recorded(path: Path) -> str:
    with path.open(encoding="utf-8") as fh:
        match = FIRST_LINE.match(fh.readline().rstrip("\n"))
    assert match, f"{path.name} has no sources hash in its first line: run `npm run build` in admin/frontend"
    return match.group(1)


@pytest.mark.parametrize("name", ["builder.js", "builder.css"])
def test_the_committed_bundle_was_built_from_the_current_sources(name: str) -> None:
    assert recorded(BUNDLE / name) == sources_hash(), (
        f"admin/static/flows/{name} is stale: run `npm ci && npm run build` in admin/frontend and commit it")


def test_the_hash_changes_with_any_source_byte(tmp_path: Path) -> None:
    # The check can fail: a copy of the sources with one byte more gives another hash.
    copy = tmp_path / "frontend"
    for name in ["package.json", "package-lock.json", "build.mjs"]:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((FRONTEND / name).read_bytes())
    for source in (FRONTEND / "src").rglob("*"):
        if source.is_file():
            target = copy / source.relative_to(FRONTEND)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    assert sources_hash(copy) == sources_hash()
    app = copy / "src" / "App.jsx"
    app.write_bytes(app.read_bytes() + b"\n")
    assert sources_hash(copy) != sources_hash()


def test_the_lock_file_pins_react_flow_12_and_the_build_is_minified() -> None:
    lock = json.loads((FRONTEND / "package-lock.json").read_text())
    packages = lock["packages"]
    assert packages["node_modules/@xyflow/react"]["version"].startswith("12.")
    assert all(meta.get("integrity") for key, meta in packages.items() if key)  # every package pinned by hash
    bundle = (BUNDLE / "builder.js").read_text(encoding="utf-8")
    assert len(bundle.splitlines()) < 200  # minified, not a development build
    assert "process.env.NODE_ENV" not in bundle and "/Users/" not in bundle and str(ROOT) not in bundle
