"""What an upstream server is, from its own answers (docs/upstream.md). Pure: JSON in, facts out.

A node that fronts a server asks it, when it starts and every ``PROBE_INTERVAL_S`` after:

- llama.cpp's ``llama-server``: ``GET /props`` (the context of one slot, the slots, the GGUF file
  it loaded, its chat template) and ``GET /v1/models`` (vocabulary size, parameters, file size);
  its ``/tokenize`` gives the exact ids, ``/completion`` generates from ids and returns ids;
- vLLM: ``POST /tokenize`` answers ``{count, max_model_len, tokens}`` (the context is
  ``max_model_len``) and ``GET /v1/models`` names the checkpoint it serves (``root``);
- anything else (Ollama's OpenAI API, TGI, another meshd): only ``GET /v1/models``; no tokenizer
  and no context length can be learned, so the node packs text (``meshd.upstream.codec``) and
  takes the context from its config.

**Model identity** (``model_identity``): what the model really is, advertised per model (``mid``)
so that two different models never pass for one under the same name:

- ``gguf:<digest of the GGUF file>`` for llama-server when the file it names is readable here
  (a native import of that file records the same digest: ``Manifest.source["gguf_sha256"]``,
  ``meshd.core.modelid``), so a node serving the GGUF natively and one fronting llama-server with
  it are the same model;
- ``llama.cpp:<file name>:<parameters>:<bytes>:<ftype>`` when the file is not readable here;
- ``hf:<checkpoint>`` for vLLM (its ``root``: the Hugging Face id or path it loaded);
- ``upstream:<model>@<host:port>`` otherwise: only as good as the server's name for its model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from meshd.core import modelid

LLAMA_CPP, VLLM, OPENAI = "llama.cpp", "vllm", "openai"
SERVER_TOKENIZER_DOMAIN = b"meshd-upstream-tokenizer-v1\0"
MAX_REF_CHARS = 200
MAX_TEMPLATE_CHARS = 1 << 16


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What one probe learned (0 or "": the server did not say)."""

    kind: str  # LLAMA_CPP, VLLM or OPENAI
    context_length: int = 0  # tokens one request may hold (prompt + output)
    model_path: str = ""  # llama.cpp: the GGUF file it loaded (a path on the server's host)
    model_ref: str = ""  # the server's own name for its model (/v1/models id, vLLM's root)
    n_vocab: int = 0
    n_params: int = 0
    size_bytes: int = 0
    ftype: str = ""
    slots: int = 0  # llama.cpp: parallel slots (-np)
    chat_template: str = ""
    build: str = ""  # llama.cpp: build_info

    def statistics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("context_length", "model_path", "model_ref", "n_vocab", "n_params",
                    "size_bytes", "ftype", "slots", "build"):
            v = getattr(self, key)
            if v:
                out[key] = v
        return out


def _int(v: Any) -> int:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _str(v: Any, cap: int = MAX_REF_CHARS) -> str:
    return v[:cap] if isinstance(v, str) else ""


def _models_data(models: Any) -> list[dict[str, Any]]:
    data = models.get("data") if isinstance(models, dict) else None
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def is_llama_cpp(props: Any) -> bool:
    """Whether a ``GET /props`` answer is llama-server's."""
    return (isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict)
            and "model_path" in props)


def llama_cpp_facts(props: dict[str, Any], models: Any) -> ServerFacts:
    """Facts from llama-server's ``/props`` and ``/v1/models`` answers."""
    gen = props.get("default_generation_settings") or {}
    meta: dict[str, Any] = {}
    for m in _models_data(models):
        if isinstance(m.get("meta"), dict):
            meta = m["meta"]
            break
    return ServerFacts(
        kind=LLAMA_CPP,
        context_length=_int(gen.get("n_ctx")) or _int(meta.get("n_ctx")),
        model_path=_str(props.get("model_path"), 4096),
        model_ref=_str(props.get("model_alias")),
        n_vocab=_int(meta.get("n_vocab")),
        n_params=_int(meta.get("n_params")),
        size_bytes=_int(meta.get("size")),
        ftype=_str(props.get("model_ftype") or meta.get("ftype"), 32),
        slots=_int(props.get("total_slots")),
        chat_template=_str(props.get("chat_template"), MAX_TEMPLATE_CHARS),
        build=_str(props.get("build_info"), 64),
    )


def is_vllm_tokenize(answer: Any) -> bool:
    """Whether a ``POST /tokenize`` answer is vLLM's (``{count, max_model_len, tokens}``)."""
    return (isinstance(answer, dict) and isinstance(answer.get("tokens"), list)
            and "max_model_len" in answer)


def vllm_facts(tokenize_answer: dict[str, Any], models: Any, upstream_model: str) -> ServerFacts:
    """Facts from vLLM's ``/tokenize`` and ``/v1/models`` answers."""
    ref = upstream_model
    ctx = _int(tokenize_answer.get("max_model_len"))
    for m in _models_data(models):
        if m.get("id") == upstream_model:
            ref = _str(m.get("root")) or ref
            ctx = ctx or _int(m.get("max_model_len"))
    return ServerFacts(kind=VLLM, context_length=ctx, model_ref=ref[:MAX_REF_CHARS])


def openai_facts(models: Any, upstream_model: str) -> ServerFacts:
    """Facts of a server that has neither ``/props`` nor ``/tokenize``: its name for the model."""
    return ServerFacts(kind=OPENAI, model_ref=upstream_model[:MAX_REF_CHARS])


def model_identity(facts: ServerFacts, base_url: str, upstream_model: str,
                   gguf_sha256: str = "") -> str:
    """The model identity (module docstring) of what ``facts`` describe."""
    if gguf_sha256:
        return modelid.gguf(gguf_sha256)
    if facts.kind == LLAMA_CPP:
        name = facts.model_path.replace("\\", "/").rsplit("/", 1)[-1] or facts.model_ref
        return f"llama.cpp:{name[:100]}:{facts.n_params}:{facts.size_bytes}:{facts.ftype}"
    if facts.kind == VLLM:
        return f"hf:{facts.model_ref}"
    netloc = urlsplit(base_url).netloc or base_url
    return f"upstream:{upstream_model[:100]}@{netloc[:100]}"


def server_tokenizer_identity(model_id: str) -> str:
    """The tokenizer identity of a model whose ids only its server makes (its ``/tokenize``): no
    bundle exists to hand out, so no other tokenizer can ever share it."""
    return hashlib.sha256(SERVER_TOKENIZER_DOMAIN + model_id.encode()).hexdigest()


def root_url(base_url: str) -> str:
    """The server's root for the endpoints outside the OpenAI API (``/props``, ``/tokenize``,
    ``/completion``): the base URL less a trailing ``/v1``."""
    base = base_url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base
