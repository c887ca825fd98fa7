"""Where a model's tier is written down: the manifest, the advert (optional wire keys), the
node's config, and what `meshd explain` prints (docs/tiers.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshd.config import parse_config
from meshd.core.advert import Advert, ModelAdvert, decode_advert
from meshd.engine import default_model_path
from meshd.engine.manifest import parse_manifest
from meshd.errors import ConfigError, ModelError
from meshd.store.explain import explain_text


def _advert(*models: ModelAdvert) -> Advert:
    return Advert(peer_id="p", name="n", seq=1, ts=1.0, models=models)


def test_advert_carries_the_tier_and_quality_and_older_adverts_have_none() -> None:
    m = ModelAdvert("m", 4, 0, 4, context_length=2048, tier="micro", quality=0.3)
    got = decode_advert(_advert(m).encode()).models[0]
    assert (got.tier, got.quality, got.context_length) == ("micro", 0.3, 2048)
    plain = _advert(ModelAdvert("m", 4, 0, 4))
    assert "tier" not in plain.to_dict()["models"][0]  # nothing new on the wire without a tier
    assert decode_advert(plain.encode()).models[0].tier == ""


def _manifest() -> dict[str, Any]:
    return dict(json.loads((default_model_path() / "manifest.json").read_text()))


@pytest.mark.parametrize("tier", [{"tier": "large", "quality": 1.0}, {"tier": "micro"}])
def test_manifest_tier_round_trips(tier: dict[str, Any]) -> None:
    m = parse_manifest({**_manifest(), "tier": tier})
    assert m.tier == tier["tier"] and m.quality == tier.get("quality", 0.0)
    assert parse_manifest(m.to_json()).tier == tier["tier"]
    assert parse_manifest(_manifest()).tier == ""


@pytest.mark.parametrize("tier", [{"tier": "huge"}, "micro", {"tier": "micro", "quality": -1}])
def test_a_bad_manifest_tier_is_one_line(tier: Any) -> None:
    with pytest.raises(ModelError, match="tier"):
        parse_manifest({**_manifest(), "tier": tier})


def test_config_tiers() -> None:
    cfg = parse_config({"tiers": {"default_auto": True, "pin_clients": {"a": "large"},
                                  "pin_classes": {"code": "small"}},
                        "models": [{"tier": "micro", "quality": 0.2}]})
    assert cfg.tiers.default_auto and cfg.tiers.pin_clients == {"a": "large"}
    assert cfg.models[0].tier == "micro"
    for bad, key in (({"tiers": {"pin_clients": {"a": "giant"}}}, "pin_clients.a"),
                     ({"tiers": {"pin_classes": {"poetry": "large"}}}, "pin_classes.poetry"),
                     ({"tiers": {"threshold": 1.5}}, "threshold"),
                     ({"models": [{"tier": "mega"}]}, "tier")):
        with pytest.raises(ConfigError, match=key):
            parse_config(bad)


def test_explain_text_says_the_tier_and_why() -> None:
    rec = {"request_id": "r1", "decision": None, "outcome": None, "events": [],
           "tier": {"score": 0.91, "threshold": 0.44, "prompt_class": "code", "model": "big",
                    "tier": "large", "wanted": "micro", "features": {"log_chars": 3.2},
                    "reasons": ["score 0.910 >= threshold 0.440", "escalated micro -> large"]}}
    text = explain_text(rec)
    assert "Model auto: big (tier large; wanted micro, score 0.910, threshold 0.440" in text
    assert "escalated micro -> large" in text and "log_chars=3.2" in text
