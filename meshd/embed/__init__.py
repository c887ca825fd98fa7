"""Sentence embeddings on onnxruntime: BERT encoders imported from Hugging Face checkpoints.

``load_embedder()`` gives an ``Embedder`` whose ``embed(texts)`` returns float32 [n, dim]
L2-normalised vectors; with no path it loads all-MiniLM-L6-v2 from the ``meshd[edge]`` extra.
See docs/embeddings.md.
"""

from __future__ import annotations

from meshd.embed.arch import BERT_ARCHITECTURES, BertArch, is_bert_config
from meshd.embed.embedder import Embedder, load_embedder
from meshd.embed.importer import import_bert
from meshd.embed.manifest import EmbedManifest, is_embedding_dir, read_embed_manifest
from meshd.embed.package import DEFAULT_EMBED_MODEL, default_embedding_model

__all__ = [
    "BERT_ARCHITECTURES",
    "DEFAULT_EMBED_MODEL",
    "BertArch",
    "EmbedManifest",
    "Embedder",
    "default_embedding_model",
    "import_bert",
    "is_bert_config",
    "is_embedding_dir",
    "load_embedder",
    "read_embed_manifest",
]
