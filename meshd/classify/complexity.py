"""``TierClassifier``: P(complex) of a prompt from its sentence embedding and its cheap features.

The model is a small ONNX graph (``x`` float32 [n, dim + features] -> ``p_complex`` [n, 1]; the
feature standardisation is inside it) with a JSON file beside it naming the embedding model, the
features and the decision threshold. Scoring one prompt is the features (``meshd.core.
prompt_features``, pure) and one onnxruntime run on one thread: well under a millisecond
(benchmarks/bench_tiers.py). The embedding comes from the caller (``meshd.embed``), so one
embedding can serve the semantic cache and the classifier alike.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshd.core.prompt_features import FEATURE_NAMES, PromptFeatures, prompt_features
from meshd.errors import ModelError

NAME = "complexity-v1"


def shipped_classifier() -> Path:
    """The ONNX file of the classifier shipped in the package data."""
    return Path(__file__).resolve().parents[1] / "data" / "classifier" / f"{NAME}.onnx"


@dataclass(frozen=True, slots=True)
class Scored:
    score: float  # P(complex), in [0, 1]
    features: PromptFeatures


class TierClassifier:
    """Thread-safe; one onnxruntime session on one intra-op thread."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        meta_path = path.with_suffix(".json")
        try:
            self.meta: dict[str, Any] = json.loads(meta_path.read_text())
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except FileNotFoundError as e:
            raise ModelError(f"tier classifier {e.filename}: no such file") from None
        except (OSError, ValueError) as e:
            raise ModelError(f"tier classifier {path}: cannot be read ({e})") from None
        except Exception as e:  # onnxruntime's own errors: a broken graph
            raise ModelError(f"tier classifier {path}: not a usable ONNX model ({e})") from None
        if tuple(self.meta.get("features", ())) != FEATURE_NAMES:
            raise ModelError(f"tier classifier {meta_path}: its features are not this meshd's "
                             f"({', '.join(FEATURE_NAMES)}); retrain it")
        self.path = path
        self.name = str(self.meta.get("name", path.stem))
        self.embedding = str(self.meta.get("embedding", ""))
        self.dim = int(self.meta["embedding_dim"])
        self.threshold = float(self.meta["threshold"])
        self._input = self.session.get_inputs()[0].name
        self._lock = threading.Lock()
        self.scored = 0

    def score(self, text: str, embedding: np.ndarray) -> Scored:
        """P(complex) of ``text`` whose sentence embedding (the classifier's model) is given."""
        f = prompt_features(text)
        x = np.empty((1, self.dim + len(f.values)), dtype=np.float32)
        x[0, :self.dim] = np.asarray(embedding, dtype=np.float32).reshape(-1)[:self.dim]
        x[0, self.dim:] = f.values
        (p,) = self.session.run(None, {self._input: x})
        with self._lock:
            self.scored += 1
        return Scored(float(p.reshape(-1)[0]), f)

    def statistics(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold, "scored": self.scored}


def load_classifier(path: str | Path | None = None) -> TierClassifier:
    """The classifier at ``path`` (an .onnx file with its .json beside it), or the shipped one.
    Raises ``ModelError`` with one line when it cannot be used."""
    return TierClassifier(Path(path) if path else shipped_classifier())
