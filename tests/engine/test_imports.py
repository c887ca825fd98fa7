"""The product never imports torch (it may be a dev-only dependency of the training script)."""

from __future__ import annotations

import subprocess
import sys


def test_engine_does_not_import_torch() -> None:
    code = ("import sys; import meshd.engine, meshd.engine.protocols, meshd.cli.model; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
