"""The layout is the architecture (docs/architecture.md): imports run one way between engine's
packages and between the top-level packages, and there is no import circle anywhere. The
contracts live in pyproject.toml and are checked by import-linter; this test runs them and keeps
the document and the contracts saying the same thing."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_every_import_contract_is_kept() -> None:
    result = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    kept = f"Contracts: {len(_contracts())} kept, 0 broken."
    assert result.returncode == 0 and kept in result.stdout, result.stdout[-4000:] + result.stderr[-2000:]


def test_every_engine_package_is_a_layer() -> None:
    # A new package outside the layers would escape the one-way rule without anyone deciding it.
    packages = {p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").exists()}
    layers = [name.removeprefix("engine.") for name in _contracts()["engine-layers"]["layers"]]
    assert sorted(layers) == sorted(packages)


def test_engine_top_level_stays_small() -> None:
    entries = sorted(p.name for p in (ROOT / "engine").iterdir() if p.name != "__pycache__")
    assert len(entries) <= 12, entries
    assert [e for e in entries if e.endswith(".py")] == ["__init__.py"], "engine's modules live in its packages"


def test_the_documented_order_is_the_checked_order() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("<!-- layers", 1)[1]
    documented = re.findall(r"^\| `(\w+)` \|", table.split("\n\n", 1)[0], flags=re.M)
    layers = [name.removeprefix("engine.") for name in _contracts()["engine-layers"]["layers"]]
    assert documented == layers
