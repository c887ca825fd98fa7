"""Import a BERT sentence encoder (Hugging Face / sentence-transformers directory) into a meshd
embedding model directory: ``manifest.json``, ``weights.bin``, ``tokenizer.json``,
``encoder.onnx``.

Reads ``config.json``, ``model.safetensors`` (or shards), ``tokenizer.json`` and, when present,
the sentence-transformers files that say how to pool (``modules.json``,
``1_Pooling/config.json``, ``sentence_bert_config.json``). Like ``meshd.engine.import_hf`` it
builds in a temporary sibling directory and renames it into place. With ``int8`` (the default)
it also writes ``encoder-int8.onnx``, the dynamically quantized graph (meshd.embed.quantize).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from meshd import __version__
from meshd.embed.arch import bert_tensors, parse_bert_config
from meshd.embed.graph import build_encoder_graph
from meshd.embed.manifest import EmbedManifest
from meshd.embed.quantize import with_int8
from meshd.errors import LocalError, ModelError
from meshd.modeldir.importing import (
    check_output_dir,
    load_tokenizer,
    read_json,
    read_json_object,
    staging,
)
from meshd.modeldir.safetensors_io import Checkpoint
from meshd.modeldir.weights import WeightsWriter, file_sha256

log = logging.getLogger(__name__)
WEIGHTS_FILE, TOKENIZER_FILE, GRAPH_FILE = "weights.bin", "tokenizer.json", "encoder.onnx"
# Head models (BertForMaskedLM, ...) name the encoder's tensors with this prefix.
HEAD_PREFIX = "bert."


def import_bert(hf_dir: Path, out: Path, *, dtype: str = "fp32", name: str | None = None,
                version: str = "1", force: bool = False,
                source_extra: dict[str, Any] | None = None, int8: bool = True) -> EmbedManifest:
    """Import the BERT checkpoint in ``hf_dir`` into a new embedding model directory ``out``
    (with ``int8``, also its int8 graph: a few seconds more for all-MiniLM-L6-v2)."""
    hf_dir, out = Path(hf_dir), Path(out)
    if dtype not in ("fp32", "fp16"):
        raise LocalError(f"dtype={dtype!r} is not supported (fp32, fp16)")
    if not hf_dir.is_dir():
        raise ModelError(f"{hf_dir}: no such directory")
    check_output_dir(out, force)
    cfg = read_json_object(hf_dir / "config.json")
    pooling = read_json(hf_dir / "1_Pooling" / "config.json", missing_ok=True)
    modules = read_json(hf_dir / "modules.json", missing_ok=True)
    st_cfg = read_json(hf_dir / "sentence_bert_config.json", missing_ok=True)
    arch = parse_bert_config(cfg, pooling_cfg=pooling if isinstance(pooling, dict) else None,
                             modules=modules if isinstance(modules, list) else None,
                             st_cfg=st_cfg if isinstance(st_cfg, dict) else None)
    ckpt = Checkpoint(hf_dir)
    prefix = "" if "embeddings.word_embeddings.weight" in ckpt else HEAD_PREFIX
    tok_path = hf_dir / TOKENIZER_FILE
    load_tokenizer(tok_path, arch.vocab_size)

    with staging(out, force) as tmp:
        source_dtypes = set()
        with (tmp / WEIGHTS_FILE).open("wb") as f:
            writer = WeightsWriter(f)
            for tname, shape in bert_tensors(arch):
                full = prefix + tname
                if full not in ckpt:
                    raise ModelError(f"checkpoint: tensor {full!r} is missing")
                info = ckpt.info(full)
                if info.shape != shape:
                    raise ModelError(f"{ckpt.source_of(full)}: tensor {full!r} has shape "
                                     f"{list(info.shape)}, config.json implies {list(shape)}")
                source_dtypes.add(info.dtype)
                array = ckpt.read(full)
                if dtype == "fp16":
                    with np.errstate(over="ignore"):
                        array = array.astype(np.float16)
                    if not np.isfinite(array).all():
                        raise ModelError(f"{ckpt.source_of(full)}: tensor {full!r} overflows "
                                         "float16; import with --dtype fp32")
                writer.add(tname, array, dtype)
        shutil.copyfile(tok_path, tmp / TOKENIZER_FILE)
        entries = {e.name: e for e in writer.entries}
        graph = build_encoder_graph(arch, entries, WEIGHTS_FILE).SerializeToString()
        (tmp / GRAPH_FILE).write_bytes(graph)
        manifest = EmbedManifest(
            name=name or out.name, version=version, arch=arch, dtype=dtype,
            weights_file=WEIGHTS_FILE, weights_bytes=writer.nbytes, weights_sha256=writer.sha256,
            tensors=tuple(writer.entries), tokenizer_file=TOKENIZER_FILE,
            tokenizer_sha256=file_sha256(tmp / TOKENIZER_FILE), graph_file=GRAPH_FILE,
            graph_sha256=hashlib.sha256(graph).hexdigest(),
            source={"architectures": cfg.get("architectures"),
                    "model_type": cfg.get("model_type"), "dtypes": sorted(source_dtypes),
                    **(source_extra or {})},
            created_by=f"meshd {__version__}",
        )
        if int8:
            manifest = with_int8(tmp, manifest)
        manifest.write(tmp)
    log.info("embedding model imported name=%s layers=%d dim=%d dtype=%s out=%s", manifest.name,
             arch.num_layers, arch.dim, dtype, out)
    return manifest

