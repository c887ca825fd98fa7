"""The tier classifier: how complex a prompt is, from its sentence embedding and cheap features,
run in-process on onnxruntime (docs/tiers.md). ``load_classifier()`` gives the one shipped in
``meshd/data/classifier`` (trained by scripts/train_tier_classifier.py)."""

from __future__ import annotations

from meshd.classify.complexity import Scored, TierClassifier, load_classifier, shipped_classifier

__all__ = ["Scored", "TierClassifier", "load_classifier", "shipped_classifier"]
