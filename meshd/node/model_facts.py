"""What this node knows about each model of the mesh beyond who serves it, for the APIs that
describe models (Ollama's ``/api/tags`` and ``/api/show``, docs/ollama.md).

A model served here is described from its manifest (docs/model-format.md): architecture,
parameter count, how its weights are stored, their bytes and sha256, layers, hidden size and
chat template. A model only peers serve is described from their adverts: how its weights are
stored (the advert's ``fmt``), layers and hidden size; the rest is unknown here and left out.
Nothing here is read from disk: manifests are in memory once a model is loaded.
"""

from __future__ import annotations

from typing import Any, Protocol

from meshd.node.membership import weight_format
from meshd.node.runner import Runner
from meshd.node.view import MeshView


class FactsNode(Protocol):
    """What the facts are read from (``meshd.node.entry.context.EntryNode`` conforms)."""

    runner: Runner

    @property
    def membership(self) -> MeshView: ...


def parameter_count(arch: Any) -> int:
    """The parameters of a Llama-family model (Llama, Qwen2, Gemma 3) from its manifest's
    ``architecture`` figures: the count of the unquantized model, whatever the stored format
    (4-bit tensors are packed, so their table's shapes would not give it)."""
    h, heads, kv, d = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim
    q, k = heads * d, kv * d
    attn = h * q + 2 * h * k + q * h
    if arch.qkv_bias:
        attn += q + 2 * k
    if arch.o_bias:
        attn += h
    mlp = 3 * h * arch.intermediate_size
    if arch.mlp_bias:
        mlp += 2 * arch.intermediate_size + h
    norms = h * (4 if getattr(arch, "sandwich_norm", False) else 2)
    if getattr(arch, "qk_norm", False):
        norms += 2 * d
    embed = arch.vocab_size * h
    head = 0 if arch.tie_word_embeddings else arch.vocab_size * h
    return int(embed + arch.num_layers * (attn + mlp + norms) + h + head)


def local_facts(model: Any) -> dict[str, Any]:
    """The facts of a model served here (an engine model with a manifest, or an upstream)."""
    out: dict[str, Any] = {}
    fmt = weight_format(model)
    if fmt:
        out["format"] = fmt
    manifest = getattr(model, "manifest", None)
    if manifest is None:
        return out
    arch = manifest.arch
    out.update({"architecture": arch.arch, "parameters": parameter_count(arch),
                "size_bytes": int(manifest.weights_bytes), "layers": arch.num_layers,
                "hidden_size": arch.hidden_size})
    digest = getattr(manifest, "content_hash", "")
    if digest:
        out["digest"] = str(digest)
    template = getattr(manifest.tokenizer, "chat_template", None)
    if template:
        out["chat_template"] = template
    return out


def model_facts(node: FactsNode) -> dict[str, dict[str, Any]]:
    """``{model name: facts}`` for every model this node serves or hears of; a fact that is not
    known is absent (keys: format, architecture, parameters, size_bytes, digest, layers,
    hidden_size, chat_template, tier)."""
    out: dict[str, dict[str, Any]] = {}
    for name, served in node.runner.models.items():
        out[name] = local_facts(served.model)
        if getattr(served, "tier", ""):
            out[name]["tier"] = served.tier
    for e in node.membership.table.live():
        for m in e.advert.models:
            row = out.setdefault(m.name, {})
            if m.weight_format:
                row.setdefault("format", m.weight_format)
            if m.tier:
                row.setdefault("tier", m.tier)
            if m.num_layers:
                row.setdefault("layers", m.num_layers)
            if m.hidden_size:
                row.setdefault("hidden_size", m.hidden_size)
    return out
