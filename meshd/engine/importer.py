"""``meshd model import``: a Hugging Face checkpoint directory in, a meshd model directory out.

Reads ``config.json``, ``model.safetensors`` (or shards with their index), ``tokenizer.json`` and
``tokenizer_config.json``; writes ``manifest.json``, ``weights.bin``, ``tokenizer.json`` and one
ONNX graph per requested stage. The output is built in a temporary sibling directory and renamed
into place, so a failed import leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from meshd import __version__
from meshd.engine.arch import Arch, parse_hf_config
from meshd.engine.graph import build_stage_graph
from meshd.engine.manifest import DTYPES, Manifest, StageEntry, TokenizerInfo
from meshd.engine.planning import EMBED, LM_HEAD, model_tensors, plan_stages, stage_memory
from meshd.engine.quant import BLOCK, quantize
from meshd.errors import LocalError, ModelError
from meshd.modeldir.importing import check_output_dir, load_tokenizer, read_json_object, staging
from meshd.modeldir.safetensors_io import Checkpoint
from meshd.modeldir.weights import WeightsWriter, file_sha256

log = logging.getLogger(__name__)
WEIGHTS_FILE = "weights.bin"
TOKENIZER_FILE = "tokenizer.json"


def stage_file_name(start: int, end: int) -> str:
    return f"layers-{start}-{end}.onnx"


def write_stage_files(folder: Path, arch: Arch, writer: WeightsWriter,
                      ranges: list[tuple[int, int]], dtype: str) -> list[StageEntry]:
    """Write the stage graph of each layer range of ``ranges`` over the tensors ``writer``
    stored, into ``folder``; return their manifest entries (file, hash, memory estimate)."""
    entries = {e.name: e for e in writer.entries}
    stored = {e.name: (e.dtype, e.nbytes) for e in writer.entries}
    out = []
    for start, end in ranges:
        data = build_stage_graph(arch, entries, start, end, WEIGHTS_FILE).SerializeToString()
        fname = stage_file_name(start, end)
        (folder / fname).write_bytes(data)
        memory = stage_memory(arch, start, end, dtype, stored)
        out.append(StageEntry(start, end, fname, hashlib.sha256(data).hexdigest(),
                              memory.to_json()))
    return out


def import_hf(hf_dir: Path, out: Path, *, stages: int = 1, dtype: str = "fp32",
              name: str | None = None, version: str = "1", force: bool = False) -> Manifest:
    """Import the checkpoint in ``hf_dir`` into a new model directory ``out``."""
    hf_dir, out = Path(hf_dir), Path(out)
    if dtype not in DTYPES:
        raise LocalError(f"dtype={dtype!r} is not supported ({', '.join(DTYPES)})")
    if not hf_dir.is_dir():
        raise ModelError(f"{hf_dir}: no such directory")
    check_output_dir(out, force)
    cfg = read_json_object(hf_dir / "config.json")
    arch = parse_hf_config(cfg)
    ranges = plan_stages(arch.num_layers, stages)
    ckpt = Checkpoint(hf_dir)
    tok_info = _tokenizer_info(hf_dir, cfg, arch)

    with staging(out, force) as tmp:
        with (tmp / WEIGHTS_FILE).open("wb") as f:
            writer = WeightsWriter(f)
            source_dtypes = set()
            for tname, shape in model_tensors(arch):
                array = _read_tensor(ckpt, tname, shape)
                source_dtypes.add(ckpt.info(tname).dtype)
                bits = quant_bits(tname, shape, dtype)
                if bits:
                    writer.add_blockwise(tname, quantize(array, bits))
                    continue
                if dtype == "fp16" and array.dtype != np.float16:
                    with np.errstate(over="ignore"):
                        array = array.astype(np.float16)
                    if not np.isfinite(array).all():
                        raise ModelError(
                            f"{ckpt.source_of(tname)}: tensor {tname!r} overflows float16; "
                            "import with --dtype fp32"
                        )
                writer.add(tname, array, "fp16" if dtype == "fp16" else "fp32")
        shutil.copyfile(hf_dir / TOKENIZER_FILE, tmp / TOKENIZER_FILE)
        tok_info = replace(tok_info, sha256=file_sha256(tmp / TOKENIZER_FILE))
        stage_entries = write_stage_files(tmp, arch, writer, ranges, dtype)
        manifest = Manifest(
            name=name or out.name,
            version=version,
            arch=arch,
            dtype=dtype,
            weights_file=WEIGHTS_FILE,
            weights_bytes=writer.nbytes,
            weights_sha256=writer.sha256,
            tensors=tuple(writer.entries),
            tokenizer=tok_info,
            stages=tuple(stage_entries),
            source={"architectures": cfg.get("architectures"), "model_type":
                    cfg.get("model_type"), "dtypes": sorted(source_dtypes)},
            created_by=f"meshd {__version__}",
        )
        manifest.write(tmp)
    log.info("model imported name=%s layers=%d dtype=%s out=%s", manifest.name,
             arch.num_layers, dtype, out)
    return manifest


def quant_bits(name: str, shape: tuple[int, ...], dtype: str) -> int:
    """Bits per value a float tensor is quantized to at import with ``--dtype`` (0: kept as
    floats). Only weight matrices whose rows split into whole blocks are quantized; norms and
    biases stay float32. At int4 the embedding (and the LM head) take 8 bits, as llama.cpp's
    4-bit files keep them at Q8_0 or Q6_K: they are a large share of a small model's error."""
    if dtype not in ("int4", "int8") or len(shape) != 2 or shape[1] % BLOCK:
        return 0
    if dtype == "int8" or name in (EMBED, LM_HEAD):
        return 8
    return 4


def _read_tensor(ckpt: Checkpoint, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in ckpt:
        hint = " (config.json has tie_word_embeddings=false)" if name == LM_HEAD else ""
        raise ModelError(f"checkpoint: tensor {name!r} is missing{hint}")
    info = ckpt.info(name)
    if info.shape != shape:
        raise ModelError(
            f"{ckpt.source_of(name)}: tensor {name!r} has shape {list(info.shape)}, "
            f"config.json implies {list(shape)}"
        )
    return ckpt.read(name)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _tokenizer_info(hf_dir: Path, cfg: dict[str, Any], arch: Arch) -> TokenizerInfo:
    tok = load_tokenizer(hf_dir / TOKENIZER_FILE, arch.vocab_size)
    tcfg_path = hf_dir / "tokenizer_config.json"
    tcfg = read_json_object(tcfg_path) if tcfg_path.is_file() else {}
    bos, eos = _token_text(tcfg.get("bos_token")), _token_text(tcfg.get("eos_token"))
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja = hf_dir / "chat_template.jinja"
    if not template and jinja.is_file():
        template = jinja.read_text()
    gen_path = hf_dir / "generation_config.json"
    gen = read_json_object(gen_path) if gen_path.is_file() else {}

    bos_ids = _ids(cfg.get("bos_token_id"))
    bos_id = tok.token_to_id(bos) if bos is not None else None
    if not bos_ids and bos_id is not None:
        bos_ids = [bos_id]
    eos_ids = _ids(cfg.get("eos_token_id")) + _ids(gen.get("eos_token_id"))
    eos_id = tok.token_to_id(eos) if eos is not None else None
    if eos_id is not None:
        eos_ids.append(eos_id)
    eos_ids = sorted(set(eos_ids))
    for i in [*bos_ids, *eos_ids]:
        if not 0 <= i < arch.vocab_size:
            raise ModelError(f"config.json: special token id {i} is outside the vocabulary")
    return TokenizerInfo(
        file=TOKENIZER_FILE, sha256="", bos_token_id=bos_ids[0] if bos_ids else None,
        eos_token_ids=tuple(eos_ids), bos_token=bos, eos_token=eos,
        chat_template=template if isinstance(template, str) and template else None,
    )

