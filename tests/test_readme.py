"""The README names the CLI verbs that exist (issue 13, defect 11: step 5 said no verb pushes
revocations while `meshd keys push-revocations` did)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from meshd.cli.main import build_parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _verbs(parser: argparse.ArgumentParser, command: str) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    inner = sub.choices[command]
    return set(next(a for a in inner._actions
                    if isinstance(a, argparse._SubParsersAction)).choices)


def test_every_keys_verb_is_in_the_readme() -> None:
    verbs = _verbs(build_parser(), "keys")
    assert "push-revocations" in verbs
    missing = {v for v in verbs if not re.search(rf"\b{re.escape(v)}\b", README)}
    assert not missing, f"README does not mention meshd keys {sorted(missing)}"


def test_revocation_step_uses_the_cli_verb() -> None:
    step5 = README[README.index("5. To cut a node off"):]
    step5 = step5[:step5.index("\n\n")]
    assert "meshd keys push-revocations" in step5
    assert "not written yet" not in README
