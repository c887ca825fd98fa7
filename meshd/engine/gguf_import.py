"""``meshd model import FILE.gguf``: a llama.cpp GGUF file in, a meshd model directory out.

The architecture comes from the GGUF metadata (``gguf_arch``), the tokenizer from its
vocabulary (``gguf_vocab``), and every weight is carried over as it is stored: llama.cpp's 4-
and 8-bit blocks become MatMulNBits blocks with the same scales (``quant.from_gguf``), float
tensors stay float. ``dtype`` other than ``auto`` re-encodes the matrices instead (``int4``,
``int8``, ``fp16``, ``fp32``). llama.cpp's converter permutes the rows of q and k for its
interleaved RoPE on ``llama`` models; the import undoes that, so the weights are in Hugging Face
layout as every meshd graph expects. The output is built in a temporary sibling directory and
renamed into place: a failed import leaves nothing behind.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from meshd import __version__
from meshd.engine.gguf_arch import GgufModel, GgufTensor, gguf_tensor_name, read_gguf_model
from meshd.engine.importer import TOKENIZER_FILE, WEIGHTS_FILE, quant_bits, write_stage_files
from meshd.engine.manifest import Manifest, TokenizerInfo
from meshd.engine.planning import model_tensors, plan_stages
from meshd.engine.quant import GGUF_FLOAT_TYPES, Blockwise, from_gguf, quantize
from meshd.errors import LocalError, ModelError
from meshd.modeldir.importing import check_output_dir, staging
from meshd.modeldir.weights import WeightsWriter, file_sha256

log = logging.getLogger(__name__)
GGUF_DTYPES = ("auto", "int4", "int8", "fp16", "fp32")


def import_gguf(gguf_path: Path, out: Path, *, stages: int = 1, dtype: str = "auto",
                name: str | None = None, version: str = "1", force: bool = False) -> Manifest:
    """Import the GGUF file ``gguf_path`` into a new model directory ``out``."""
    gguf_path, out = Path(gguf_path), Path(out)
    if dtype not in GGUF_DTYPES:
        raise LocalError(f"dtype={dtype!r} is not supported for GGUF ({', '.join(GGUF_DTYPES)})")
    if not gguf_path.is_file():
        raise ModelError(f"{gguf_path}: no such file")
    check_output_dir(out, force)
    model = read_gguf_model(gguf_path)
    arch = model.arch
    ranges = plan_stages(arch.num_layers, stages)

    try:
        with staging(out, force) as tmp:
            kinds: set[str] = set()
            with (tmp / WEIGHTS_FILE).open("wb") as f:
                writer = WeightsWriter(f)
                for tname, shape in model_tensors(arch):
                    kinds.add(_write_tensor(writer, model, tname, shape, dtype))
            (tmp / TOKENIZER_FILE).write_text(model.vocab.tokenizer_json)
            tok_info = TokenizerInfo(
                file=TOKENIZER_FILE, sha256=file_sha256(tmp / TOKENIZER_FILE),
                bos_token_id=model.vocab.bos_token_id,
                eos_token_ids=tuple(model.vocab.eos_token_ids), bos_token=model.vocab.bos_token,
                eos_token=model.vocab.eos_token, chat_template=model.vocab.chat_template)
            model_dtype = _model_dtype(kinds) if dtype == "auto" else dtype
            stage_entries = write_stage_files(tmp, arch, writer, ranges, model_dtype)
            manifest = Manifest(
                name=name or out.name, version=version, arch=arch, dtype=model_dtype,
                weights_file=WEIGHTS_FILE, weights_bytes=writer.nbytes,
                weights_sha256=writer.sha256, tensors=tuple(writer.entries), tokenizer=tok_info,
                stages=tuple(stage_entries),
                source={"gguf": gguf_path.name, "gguf_sha256": model.file_sha256,
                        "general.architecture": model.family, "general.name": model.title,
                        "file_type": model.file_type, "tensor_types": sorted(model.tensor_types())},
                created_by=f"meshd {__version__}",
            )
            manifest.write(tmp)
    finally:
        model.close()
    log.info("model imported name=%s source=gguf layers=%d dtype=%s out=%s", manifest.name,
             arch.num_layers, manifest.dtype, out)
    return replace(manifest)


def _write_tensor(writer: WeightsWriter, model: GgufModel, name: str, shape: tuple[int, ...],
                  dtype: str) -> str:
    """Write one tensor as the import's ``dtype`` asks; return the stored kind."""
    t = model.tensor(gguf_tensor_name(name, model.family))
    kind = t.type_name
    rows = model.rows_permutation(name)
    if kind in GGUF_FLOAT_TYPES:
        array = _float_array(t, kind).reshape(shape)
        if rows is not None:
            array = array[rows]
        bits = quant_bits(name, shape, dtype)
        if bits:
            writer.add_blockwise(name, quantize(array, bits))
            return f"q{bits}"
        # matrices stored as float16 stay float16 unless asked otherwise; norms stay float32
        half = dtype == "fp16" or (dtype == "auto" and kind == "F16")
        stored = "fp16" if half and len(shape) > 1 else "fp32"
        writer.add(name, array, stored)
        return stored
    if len(shape) != 2:
        raise ModelError(f"{model.path.name}: tensor {t.name} is {kind} but has {len(shape)} "
                         "dimensions (only matrices may be quantized)")
    blocks = from_gguf(kind, t.data.reshape(shape[0], -1))
    if blocks.shape != shape:
        raise ModelError(f"{model.path.name}: tensor {t.name} holds {list(blocks.shape)}, "
                         f"the metadata implies {list(shape)}")
    if rows is not None:
        blocks = _take_rows(blocks, rows)
    if dtype == "auto":
        writer.add_blockwise(name, blocks)
        return f"q{blocks.bits}"
    array = blocks.dequantize()
    bits = quant_bits(name, shape, dtype)
    if bits:
        writer.add_blockwise(name, quantize(array, bits))
        return f"q{bits}"
    writer.add(name, array, dtype)
    return dtype


def _float_array(t: GgufTensor, kind: str) -> np.ndarray:
    if kind == "BF16":
        return (t.data.astype(np.uint32) << 16).view(np.float32)
    return t.data.astype(np.float32)


def _take_rows(b: Blockwise, rows: np.ndarray) -> Blockwise:
    return Blockwise(b.bits, b.block_size, b.q[rows], b.scales[rows], b.zero_points[rows],
                     None if b.mins is None else b.mins[rows])


def _model_dtype(kinds: set[str]) -> str:
    """A carried-over model's dtype, by its narrowest matrices."""
    for kind, dtype in (("q4", "int4"), ("q8", "int8"), ("fp16", "fp16")):
        if kind in kinds:
            return dtype
    return "fp32"

