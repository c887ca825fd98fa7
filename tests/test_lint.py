"""Architecture fences that CI enforces: the pure core does no I/O and type-checks strictly.

``lint-imports`` checks the import-linter contract in pyproject.toml (meshd.core never imports
trio, libp2p, onnxruntime, sqlite or any adapter); mypy checks all of meshd, strictly on meshd/core.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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


def test_meshd_type_checks() -> None:
    """mypy over all of meshd (strict on meshd.core, per pyproject.toml)."""
    r = subprocess.run([sys.executable, "-m", "mypy", "meshd"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
