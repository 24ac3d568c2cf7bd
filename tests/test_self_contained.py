"""Nothing in the repository reads outside it: the README's test command passes on a plain clone,
which has no `../shared/` beside it (issue 9, point 18).

A static scan of every Python file of the checkout (the tests, bench/ and the packages) and of the
project's configuration looks for three things:
- a string naming the provider notes beside the checkout (`../shared`, `shared/conformance`,
  `conformance/samples`);
- a path built from a "..", "shared" or "conformance" component (`Path(x) / "shared"`,
  `os.path.join(x, "..")`, `open("../…")`);
- `Path(__file__)` (or `os.path.dirname(__file__)`) climbed above the repository root.
Docstrings and comments may cite sources; only code is scanned. `.ci/run` also runs the provider
tests from a copy of the tracked files that has nothing beside it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.python_source import parse

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".hypothesis", ".pytest_cache",
                ".mypy_cache", ".ruff_cache", "build", "dist", "test-artifacts"}
CONFIG_FILES = ("pyproject.toml", "setup.cfg", "pytest.ini", "tox.ini", "conftest.py")

#: A name of the notes folder beside the checkout, anywhere in a string.
OUTSIDE_NAME = re.compile(r"(?:^|[/\\])\.\.[/\\]+shared\b|\bshared[/\\]+conformance\b|\bconformance[/\\]+samples\b")
#: Path components that lead out of the checkout or into the notes folder.
SUSPECT_COMPONENTS = {"..", "shared", "conformance"}
#: Calls whose positional arguments are paths.
PATH_CALLS = {"Path", "PurePath", "PosixPath", "open", "join", "joinpath", "read_text", "read_bytes", "glob",
              "rglob", "chdir", "listdir", "scandir", "walk", "exists", "isdir", "isfile", "copy", "copytree"}


def _components(text: str) -> set[str]:
    return {part for part in re.split(r"[/\\]+", text) if part}


def _call_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


class _Scan:
    """Findings in one module; `relative` is the module's path inside the repository."""

    def __init__(self, source: str, relative: Path) -> None:
        self.relative = relative
        self.tree = parse(source, str(relative))
        self.findings: list[str] = []
        # Path(__file__) is the file; one climb is its folder, and the root is len(parts) climbs up.
        self.root_climb = len(relative.parts)
        self.docstrings = {id(node.value) for node in ast.walk(self.tree)
                           if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                           and isinstance(node.value.value, str)}
        self.names: dict[str, int] = {}
        for _ in range(3):  # ROOT = Path(__file__)…; OUT = ROOT.parent …: a few rounds settle it
            for node in ast.walk(self.tree):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
                for target in targets:
                    if isinstance(target, ast.Name):
                        climb = self.climb(node.value)  # type: ignore[arg-type]
                        if climb is not None:
                            self.names[target.id] = max(climb, self.names.get(target.id, 0))

    def climb(self, node: ast.AST) -> int | None:
        """How many levels above this file `node` is, when it is a path built from `__file__`."""
        if isinstance(node, ast.Name):
            return 0 if node.id == "__file__" else self.names.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            base = self.climb(node.value)
            return None if base is None else base + 1
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
            base = self.climb(node.value.value)
            index = node.slice
            if base is None or not (isinstance(index, ast.Constant) and isinstance(index.value, int)):
                return None
            return base + index.value + 1
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in ("resolve", "absolute", "expanduser") and isinstance(node.func, ast.Attribute):
                return self.climb(node.func.value)
            if name in ("Path", "PurePath", "PosixPath", "abspath", "realpath", "normpath", "fspath", "str") and node.args:
                return self.climb(node.args[0])
            if name == "dirname" and node.args:
                base = self.climb(node.args[0])
                return None if base is None else base + 1
        return None

    def report(self, node: ast.AST, why: str) -> None:
        finding = f"{self.relative}:{getattr(node, 'lineno', '?')}: {why}"
        if finding not in self.findings:
            self.findings.append(finding)

    def run(self) -> list[str]:
        for node in ast.walk(self.tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in self.docstrings
                    and OUTSIDE_NAME.search(node.value)):
                self.report(node, f"names a folder outside the repository: {node.value!r}")
            path_parts: list[ast.AST] = []
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                path_parts = [node.left, node.right]
            elif isinstance(node, ast.Call) and _call_name(node) in PATH_CALLS:
                path_parts = list(node.args)
            for part in path_parts:
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    suspect = _components(part.value) & SUSPECT_COMPONENTS
                    if suspect:
                        self.report(part, f"builds a path with {sorted(suspect)}: {part.value!r}")
            if isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
                climb = self.climb(node)
                if climb is not None and climb > self.root_climb:
                    self.report(node, f"climbs {climb - self.root_climb} level(s) above the repository root "
                                      f"from __file__")
        return self.findings


def scan_source(source: str, relative: Path) -> list[str]:
    return _Scan(source, relative).run()


def python_files() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if not SKIPPED_DIRS.intersection(relative.parts[:-1]) and not any(
                part.endswith(".egg-info") for part in relative.parts):
            found.append(path)
    return found


def test_no_code_reads_outside_the_repository() -> None:
    files = python_files()
    assert any(p.relative_to(ROOT).parts[0] == "tests" for p in files)
    assert any(p.relative_to(ROOT).parts[0] == "engine" for p in files)  # the packages are scanned too
    findings = [f for path in files
                for f in scan_source(path.read_text(encoding="utf-8"), path.relative_to(ROOT))]
    assert findings == [], "reads outside the repository:\n" + "\n".join(findings)


def test_the_configuration_points_inside_the_repository() -> None:
    for name in CONFIG_FILES:
        path = ROOT / name
        if path.is_file() and not name.endswith(".py"):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                assert not OUTSIDE_NAME.search(line), f"{name}:{number}: {line}"
                assert not re.search(r"""["']\.\.[/\\"']""", line), f"{name}:{number}: {line}"


def test_the_fixtures_live_in_the_repository() -> None:
    from tests.fixtures import PROVIDERS, fixture_path

    assert PROVIDERS.is_relative_to(ROOT) and (PROVIDERS / "README.md").is_file()
    for escape in ("../README.md", "../../conftest.py", "/etc/hostname"):
        try:
            fixture_path(escape)
        except ValueError:
            continue
        raise AssertionError(f"fixture_path({escape!r}) left tests/fixtures/providers/")


# --- the scan itself: it must find what the suite used to do, and only that ---

#: tests/conformance.py as it was: it read the samples from `shared/` beside the checkout.
OLD_READER = '''
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "conformance"


def sample_bytes(relative):
    return (ROOT / relative).read_bytes()
'''


def test_the_scan_finds_the_old_reader() -> None:
    findings = scan_source(OLD_READER, Path("tests/conformance.py"))
    assert any("climbs 1 level(s) above the repository root" in f for f in findings), findings
    assert any("['shared']" in f for f in findings) and any("['conformance']" in f for f in findings), findings


def test_the_scan_finds_other_ways_out() -> None:
    up, notes = "..", "shared"  # kept apart so that this file does not name them itself
    cases = {
        f'open("{up}/{notes}/conformance/x.json")': "names a folder outside",
        f'import os\nos.path.join(os.getcwd(), "{up}", "x")': "builds a path with ['..']",
        f'from pathlib import Path\nPath.cwd() / "{up}"': "builds a path with ['..']",
        'import os\nos.path.dirname(os.path.dirname(os.path.dirname(__file__)))': "climbs 1 level(s)",
        'from pathlib import Path\nHERE = Path(__file__).parent\nOUT = HERE.parent.parent': "climbs 1 level(s)",
        f'x = "/work/{notes}/conformance/meta.md"': "names a folder outside",
    }
    for source, expected in cases.items():
        findings = scan_source(source, Path("tests/example.py"))
        assert any(expected in f for f in findings), (source, findings)


def test_the_scan_leaves_citations_and_the_repository_alone() -> None:
    notes = "shared" + "/conformance"
    source = "\n".join([
        f'"""Wire format: {notes}/meta_whatsapp_cloud.md (a citation, not a read)."""',
        "from pathlib import Path",
        f"# see ../{notes}/twilio_sms.md",
        "ROOT = Path(__file__).resolve().parents[2]",  # tests/admin/x.py: the repository root
        'SQL = ROOT / "sql" / "sqlite"',
        'BAD_ZONES = ("", "../etc/passwd", "america/sao_paulo")',  # a value under test, not a path
    ])
    assert scan_source(source, Path("tests/admin/test_example.py")) == []
    assert scan_source("from pathlib import Path\nX = Path(__file__).parents[3]",
                       Path("tests/admin/test_example.py")) != []
