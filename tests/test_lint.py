"""Architecture fences that CI enforces: the pure core does no I/O and type-checks strictly,
imports flow one way without cycles, and the simulator stands on the core alone.

``lint-imports`` checks the import-linter contracts in pyproject.toml (meshd.core never imports
trio, libp2p, onnxruntime, sqlite or any adapter; neither does meshd.sim import those libraries);
grimp's graph of every import statement in meshd, those under ``if TYPE_CHECKING:`` and those
inside functions included, must have no cycle (``scripts/import_graph.py`` lists them), and
meshd.sim may import only meshd.core and meshd.errors of meshd; mypy checks all of meshd,
strictly on meshd/core.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (it is in the test extra: pip install -e '.[test]')")
    return found


def test_core_imports_no_io_or_adapters() -> None:
    r = subprocess.run([_tool("lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def _import_graph() -> ModuleType:
    """scripts/import_graph.py, whose ``cycles`` the test shares."""
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("meshd", cache_dir=None)


def test_no_import_cycles(graph: grimp.ImportGraph) -> None:
    """No two modules of meshd import each other, directly or through others: not at the top,
    not under TYPE_CHECKING, not inside a function (a cycle is a loop in the design however the
    import is hidden; move the shared type to the lower module)."""
    tool = _import_graph()
    found = tool.cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        f"  {', '.join(c)}:\n" + "\n".join(f"    {line}" for line in tool.closing_imports(graph, c))
        for c in found)


SIM_MAY_IMPORT = ("meshd.sim", "meshd.core", "meshd.errors")


def test_the_simulator_imports_only_the_core(graph: grimp.ImportGraph) -> None:
    """meshd.sim runs the daemon's own decisions (meshd.core) and nothing of the daemon's
    adapters: of meshd it imports only meshd.core and meshd.errors."""
    sim = {"meshd.sim"} | graph.find_descendants("meshd.sim")
    wrong = sorted(
        f"{m} -> {i}" for m in sim for i in graph.find_modules_directly_imported_by(m)
        if not any(i == p or i.startswith(p + ".") for p in SIM_MAY_IMPORT)
    )
    assert not wrong, "meshd.sim imports outside meshd.core:\n  " + "\n  ".join(wrong)


def test_meshd_type_checks() -> None:
    """mypy over all of meshd (strict on meshd.core, per pyproject.toml)."""
    r = subprocess.run([sys.executable, "-m", "mypy", "meshd"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
