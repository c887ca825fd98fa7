"""Train the semantic cache's pair verifier (docs/cache.md) and write its weights into meshd.

    PYTHONPATH=.:TORCH_DIR nice -n 10 .venv/bin/python scripts/train_pair_verifier.py \
        [--cv] [--layers 2] [--epochs 2] [--out meshd/data/verifier]

Dev-only (torch is never imported by meshd): install torch apart, e.g.
``pip install --target DIR torch==2.13.0`` (the CPU wheel) and put DIR last on PYTHONPATH; run
with ``OMP_NUM_THREADS=1`` (``--threads 1``, the default: the shipped file was made so, and
another thread count may round differently). A cross-encoder: both prompts in one input,
``[CLS] cached [SEP] query [SEP]`` (token types 0 and 1), through the embeddings and the first
``--layers`` BERT layers of all-MiniLM-L6-v2 (the weights of the ``meshd[edge]`` package,
read from the model directory meshd imports it into), then one
linear unit over ``[a, b, |a - b|, a * b]``, where ``a`` and ``b`` are the mean last hidden
states of the two segments: ``p_same = sigmoid(w . features + b)``. The word-embedding table stays frozen,
so meshd reuses the package's own at run time and only the fine-tuned layers, position and
token-type embeddings, LayerNorms and the head are shipped (float16, ``pair-verifier-v2.npz``;
the run-time graph is built by ``meshd.embed.pair_verifier``).

Data (benchmarks/data/README.md): the development splits of ``cache_pairs.jsonl`` and
``train2``, as for v1. Never the held-out splits ``fresh4``, ``fresh5`` and ``fresh6``, nor the
calibration splits ``train3a``-``c`` and ``train4a``-``b`` (their near misses set the error
bound's threshold: ``scripts/calibrate_cache.py``, to be run again after any new verifier);
filtered out here, whatever the flags. A group any of whose prompts shares 70% of its words
with a held-out prompt is left out too. Besides the
labelled pairs, every two prompts of one group become a pair too, labelled by their answer ids
(equal ids: the same answer), which adds paraphrase/paraphrase and paraphrase/near-miss pairs.
Each epoch takes every pair in one of its two orders, at random.

``--cv``: for each development split in turn, train on the others (and ``train2``) and
predict the left-out split's labelled pairs; prints and writes (``--cv-out``) the out-of-fold
probabilities. Seeded: the same command on the same torch build and thread count rewrites the
same file.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import json
import math
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAIRS = ROOT / "benchmarks" / "data" / "cache_pairs.jsonl"
TRAIN_FILES = sorted((ROOT / "benchmarks" / "data").glob("cache_pairs_*.jsonl"))
# never trained on: only their prompts' words are read, to leave out...
HELD_OUT = frozenset({"fresh4", "fresh5", "fresh6", "train3a", "train3b", "train3c", "train4a",
                      "train4b"})
NEAR_HELD_OUT = 0.7  # ...any group with a prompt this close (word-set Jaccard) to one of them
DEV_SPLITS = ("tune", "test", "fresh", "fresh2", "fresh3")
OUT = ROOT / "meshd" / "data" / "verifier"
NAME = "pair-verifier-v2"
MAX_LEN = 128


def load_rows() -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in PAIRS.read_text(encoding="utf-8").splitlines() if x]
    for path in TRAIN_FILES:
        split = path.stem.removeprefix("cache_pairs_")  # train2, train3a, ..., fresh6
        for x in path.read_text(encoding="utf-8").splitlines():
            if x:
                r = json.loads(x)
                r["split"] = split
                rows.append(r)
    held = {_words(t) for r in rows if r.get("split") in HELD_OUT for t in (r["a"], r["b"])}

    @functools.cache  # an anchor stands in six rows: its words are compared once
    def near_held(text: str) -> bool:
        w = _words(text)
        return any(_jaccard(w, h) >= NEAR_HELD_OUT for h in held)

    near = {(r["split"], r["group"]) for r in rows if r.get("split") not in HELD_OUT
            and (near_held(r["a"]) or near_held(r["b"]))}
    if near:
        print(f"left out {len(near)} groups with a prompt near a held-out one: {sorted(near)}",
              flush=True)
    return [r for r in rows if r.get("split") not in HELD_OUT and (r["split"], r["group"]) not in near]


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9']+", text.lower()))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / max(1, len(a | b))


_TOKEN = re.compile(r"\w+|[^\w\s]")


def _span_change(anchor: str, miss: str, most: int = 3) -> tuple[str, str] | None:
    """``(old, new)`` when ``miss`` is ``anchor`` with one run of at most ``most`` tokens
    replaced (a changed number, entity or qualifier), as substrings of the two; else None."""
    ta, tm = list(_TOKEN.finditer(anchor)), list(_TOKEN.finditer(miss))
    ops = [o for o in difflib.SequenceMatcher(a=[m.group() for m in ta], b=[m.group() for m in tm],
                                              autojunk=False).get_opcodes() if o[0] != "equal"]
    if len(ops) != 1 or ops[0][0] != "replace":
        return None
    _, i1, i2, j1, j2 = ops[0]
    if i2 - i1 > most or j2 - j1 > most:
        return None
    return anchor[ta[i1].start():ta[i2 - 1].end()], miss[tm[j1].start():tm[j2 - 1].end()]


def swap_pairs(rows: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """Paraphrases carried over to a near miss: where a near miss changes one short run of the
    anchor's tokens and a paraphrase of the anchor contains that run word for word, the
    paraphrase with the run changed asks what the near miss asks. Pairs it with the anchor
    (another answer) and with the near miss (the same answer): the verifier sees a change of
    number or entity inside a reworded prompt, which the hand-written near misses (one edit
    away from the anchor) do not show it."""
    paras: dict[str, list[str]] = {}
    misses: dict[str, list[str]] = {}
    for r in rows:
        (paras if r["same"] else misses).setdefault(r["a"], []).append(r["b"])
    out: dict[tuple[str, str], int] = {}
    for anchor, ms in sorted(misses.items()):
        for miss in ms:
            change = _span_change(anchor, miss)
            if change is None:
                continue
            old, new = change
            pat = re.compile((r"\b" if old[0].isalnum() else "") + re.escape(old)
                             + (r"\b" if old[-1].isalnum() else ""))
            for para in paras.get(anchor, []):
                if pat.search(para):
                    moved = pat.sub(lambda _m, new=new: new, para)
                    out[(anchor, moved)] = 0
                    out[(miss, moved)] = 1
    return out


def training_pairs(rows: list[dict[str, Any]], group_extra: float, seed: int,
                   swaps: bool = False) -> list[tuple[str, str, int]]:
    """The labelled pairs, and ``group_extra`` times as many more drawn (seeded) from the
    other pairs of two prompts of one group, labelled by answer id; with ``swaps`` the pairs
    of ``swap_pairs`` too."""
    out = {(r["a"], r["b"]): int(bool(r["same"])) for r in rows}
    if swaps:
        for k, y in swap_pairs(rows).items():
            out.setdefault(k, y)
    extra: dict[tuple[str, str], int] = {}
    groups: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        g = groups.setdefault((r["split"], r["group"]), {})
        g[r["a"]] = r["answer_a"]
        g[r["b"]] = r["answer_b"]
    for g in groups.values():
        texts = sorted(g)
        for i, x in enumerate(texts):
            for y in texts[i + 1:]:
                if (x, y) not in out and (y, x) not in out:
                    extra[(x, y)] = int(g[x] == g[y])
    keys = sorted(extra)
    random.Random(seed).shuffle(keys)
    out.update({k: extra[k] for k in keys[:int(group_extra * len(out))]})
    return [(a, b, y) for (a, b), y in sorted(out.items())]


# -- the model ------------------------------------------------------------------------------

class Layer(nn.Module):
    def __init__(self, h: int, inner: int, heads: int, eps: float, drop: float) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.ln1 = nn.LayerNorm(h, eps=eps)
        self.inter, self.out = nn.Linear(h, inner), nn.Linear(inner, h)
        self.ln2 = nn.LayerNorm(h, eps=eps)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        d = h // self.heads

        def split(z: torch.Tensor) -> torch.Tensor:
            return z.view(b, t, self.heads, d).transpose(1, 2)

        att = split(self.q(x)) @ split(self.k(x)).transpose(-1, -2) / math.sqrt(d) + bias
        ctx = (self.drop(att.softmax(-1)) @ split(self.v(x))).transpose(1, 2).reshape(b, t, h)
        x = self.ln1(x + self.drop(self.o(ctx)))
        y = self.out(nn.functional.gelu(self.inter(x)))
        return self.ln2(x + self.drop(y))


class PairVerifier(nn.Module):
    def __init__(self, arch: Any, weights: dict[str, np.ndarray], layers: int,
                 drop: float) -> None:
        super().__init__()
        h = arch.hidden_size
        self.register_buffer("word", torch.from_numpy(
            np.array(weights["embeddings.word_embeddings.weight"], np.float32)))
        self.pos = nn.Parameter(torch.from_numpy(np.array(
            weights["embeddings.position_embeddings.weight"][:MAX_LEN], np.float32)))
        self.typ = nn.Parameter(torch.from_numpy(np.array(
            weights["embeddings.token_type_embeddings.weight"], np.float32)))
        self.ln = nn.LayerNorm(h, eps=arch.layer_norm_eps)
        self.layers = nn.ModuleList(Layer(h, arch.intermediate_size, arch.num_heads,
                                          arch.layer_norm_eps, drop) for _ in range(layers))
        self.head = nn.Linear(4 * h, 1)
        self.drop = nn.Dropout(drop)
        with torch.no_grad():
            self.ln.weight.copy_(_t(weights["embeddings.LayerNorm.weight"]))
            self.ln.bias.copy_(_t(weights["embeddings.LayerNorm.bias"]))
            for i, layer in enumerate(self.layers):
                p = f"encoder.layer.{i}."
                for mod, name in ((layer.q, "attention.self.query"),
                                  (layer.k, "attention.self.key"),
                                  (layer.v, "attention.self.value"),
                                  (layer.o, "attention.output.dense"),
                                  (layer.inter, "intermediate.dense"),
                                  (layer.out, "output.dense")):
                    mod.weight.copy_(_t(weights[p + name + ".weight"]))
                    mod.bias.copy_(_t(weights[p + name + ".bias"]))
                for ln, name in ((layer.ln1, "attention.output.LayerNorm"),
                                 (layer.ln2, "output.LayerNorm")):
                    ln.weight.copy_(_t(weights[p + name + ".weight"]))
                    ln.bias.copy_(_t(weights[p + name + ".bias"]))
            self.head.weight.zero_()
            self.head.bias.zero_()

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.word[ids] + self.pos[:t][None] + self.typ[types]
        x = self.drop(self.ln(x))
        bias = (1.0 - mask[:, None, None, :].float()) * -1e4
        for layer in self.layers:
            x = layer(x, bias)
        feats = pair_features(x, types, mask)
        return self.head(self.drop(feats))[:, 0]

    def export(self) -> dict[str, np.ndarray]:
        """The trained tensors, by the names of ``meshd.embed.pair_verifier`` (float16)."""
        out = {"pos": self.pos, "typ": self.typ, "ln.w": self.ln.weight, "ln.b": self.ln.bias,
               "head.w": self.head.weight[0], "head.b": self.head.bias}
        for i, layer in enumerate(self.layers):
            p = f"l{i}."
            out[p + "qkv.w"] = torch.cat([layer.q.weight, layer.k.weight, layer.v.weight]).T
            out[p + "qkv.b"] = torch.cat([layer.q.bias, layer.k.bias, layer.v.bias])
            out[p + "o.w"], out[p + "o.b"] = layer.o.weight.T, layer.o.bias
            out[p + "ln1.w"], out[p + "ln1.b"] = layer.ln1.weight, layer.ln1.bias
            out[p + "inter.w"], out[p + "inter.b"] = layer.inter.weight.T, layer.inter.bias
            out[p + "out.w"], out[p + "out.b"] = layer.out.weight.T, layer.out.bias
            out[p + "ln2.w"], out[p + "ln2.b"] = layer.ln2.weight, layer.ln2.bias
        return {k: np.ascontiguousarray(v.detach().numpy()).astype(np.float16)
                for k, v in out.items()}

    def round_to_fp16(self) -> None:
        """What is shipped is float16: predict with exactly those values."""
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(p.half().float())


def pair_features(x: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[a, b, |a - b|, a * b] of the mean last states of the first segment (``[CLS] cached
    [SEP]``) and of the second (``query [SEP]``): the head reads how the two differ."""
    m = mask.float()
    wa = m * (types == 0).float()
    wb = m * (types == 1).float()
    a = (x * wa[..., None]).sum(1) / wa.sum(1, keepdim=True)
    b = (x * wb[..., None]).sum(1) / wb.sum(1, keepdim=True).clamp(min=1.0)
    return torch.cat([a, b, (a - b).abs(), a * b], dim=-1)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, np.float32))


# -- data to tensors, training, prediction ---------------------------------------------------

def encode(tok: Any, pairs: list[tuple[str, str, int]]) -> list[tuple[list[int], list[int], int]]:
    encs = tok.encode_batch([(a, b) for a, b, _ in pairs])
    return [(e.ids, e.type_ids, y) for e, (_, _, y) in zip(encs, pairs, strict=True)]


def encode_both(tok: Any, pairs: list[tuple[str, str, int]]) -> list[tuple[Any, Any]]:
    """Each pair in both orders; training takes one of the two at random each epoch."""
    return list(zip(encode(tok, pairs), encode(tok, [(b, a, y) for a, b, y in pairs]),
                    strict=True))


def batches(data: list[Any], size: int, rng: random.Random | None) -> list[list[Any]]:
    """Batches of similar lengths (little padding), in random order when ``rng`` is given."""
    order = sorted(range(len(data)), key=lambda i: (len(data[i][0]), i))
    if rng is not None:  # shuffle within chunks of similar length, then the batches
        chunks = [order[i:i + size * 8] for i in range(0, len(order), size * 8)]
        for c in chunks:
            rng.shuffle(c)
        order = [i for c in chunks for i in c]
    out = [[data[i] for i in order[j:j + size]] for j in range(0, len(order), size)]
    if rng is not None:
        rng.shuffle(out)
    return out


def tensors(batch: list[Any]) -> tuple[torch.Tensor, ...]:
    t = max(len(x[0]) for x in batch)
    ids = torch.zeros(len(batch), t, dtype=torch.long)
    types = torch.zeros(len(batch), t, dtype=torch.long)
    mask = torch.zeros(len(batch), t, dtype=torch.long)
    for r, (i, ty, _) in enumerate(batch):
        ids[r, :len(i)] = torch.tensor(i)
        types[r, :len(ty)] = torch.tensor(ty)
        mask[r, :len(i)] = 1
    y = torch.tensor([float(x[2]) for x in batch])
    return ids, types, mask, y


def train(arch: Any, weights: dict[str, np.ndarray], data: list[Any], args: Any) -> PairVerifier:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = PairVerifier(arch, weights, args.layers, args.dropout)
    head = [p for n, p in model.named_parameters() if n.startswith("head.")]
    body = [p for n, p in model.named_parameters() if not n.startswith("head.")]
    opt = torch.optim.AdamW([{"params": body, "lr": args.lr},
                             {"params": head, "lr": args.lr * 20}], weight_decay=0.01)
    steps = args.epochs * math.ceil(len(data) / args.batch)
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    loss_fn = nn.BCEWithLogitsLoss()
    model.train()
    t0 = last = time.perf_counter()
    done = 0
    for epoch in range(args.epochs):
        total = 0.0
        picked = [both[rng.random() < 0.5] for both in data]
        for batch in batches(picked, args.batch, rng):
            ids, types, mask, y = tensors(batch)
            loss = loss_fn(model(ids, types, mask), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(batch)
            done += len(batch)
            if time.perf_counter() - last > 60:
                last = time.perf_counter()
                print(f"    {done} sequences ({last - t0:.0f} s)", flush=True)
        print(f"  epoch {epoch + 1}: loss {total / len(data):.4f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    model.eval()
    model.round_to_fp16()
    return model


@torch.no_grad()
def predict(model: PairVerifier, data: list[Any]) -> np.ndarray:
    out = np.empty(len(data), np.float32)
    index = {id(x): i for i, x in enumerate(data)}
    for batch in batches(data, 64, None):
        ids, types, mask, _ = tensors(batch)
        p = torch.sigmoid(model(ids, types, mask)).numpy()
        for x, v in zip(batch, p, strict=True):
            out[index[id(x)]] = v
    return out


def encoder_weights() -> tuple[Any, dict[str, np.ndarray], Any, str]:
    from tokenizers import Tokenizer

    from meshd.embed import default_embedding_model, read_embed_manifest

    path = default_embedding_model()
    m = read_embed_manifest(path)
    blob = np.memmap(path / m.weights_file, np.uint8, mode="r")
    weights = {}
    for e in m.tensors:
        if e.dtype != "fp32":
            raise SystemExit(f"{path}: expected fp32 weights, {e.name} is {e.dtype}")
        weights[e.name] = np.frombuffer(blob[e.offset:e.offset + e.nbytes], np.float32).reshape(
            e.shape)
    tok = Tokenizer.from_file(str(path / m.tokenizer_file))
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_LEN)
    return m.arch, weights, tok, m.identity


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--group-extra", type=float, default=0.0,
                    help="add this many times the labelled pairs from other pairs of a group")
    ap.add_argument("--swaps", action="store_true",
                    help="also train on paraphrases carried over to near misses (swap_pairs)")
    ap.add_argument("--cv", action="store_true", help="leave one development split out in turn")
    ap.add_argument("--cv-splits", default=",".join(DEV_SPLITS))
    ap.add_argument("--cv-out", type=Path, default=Path("/tmp/pair-verifier-cv.json"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--limit", type=int, default=0, help="train on this many pairs (timing)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    arch, weights, tok, identity = encoder_weights()
    rows = load_rows()
    print(f"rows {len(rows)} (splits {sorted({r['split'] for r in rows})})", flush=True)
    if args.cv:
        folds = {}
        for sp in args.cv_splits.split(","):
            train_rows = [r for r in rows if r["split"] != sp]
            test_rows = [r for r in rows if r["split"] == sp]
            data = encode_both(tok, training_pairs(train_rows, args.group_extra, args.seed, args.swaps))
            if args.limit:
                data = data[:args.limit]
            print(f"fold {sp}: train {len(data)} sequences, test {len(test_rows)} pairs",
                  flush=True)
            model = train(arch, weights, data, args)
            p = predict(model, encode(tok, [(r["a"], r["b"], int(r["same"])) for r in test_rows]))
            folds[sp] = [{"a": r["a"], "b": r["b"], "same": bool(r["same"]), "p": float(v)}
                         for r, v in zip(test_rows, p, strict=True)]
            same = np.array([r["same"] for r in test_rows], bool)
            print(f"  {sp}: p>=0.5 serves {np.mean(p[same] >= 0.5):.3f} of paraphrases, "
                  f"{np.mean(p[~same] >= 0.5):.3f} of near misses", flush=True)
            args.cv_out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                               "folds": folds}))
        return 0
    data = encode_both(tok, training_pairs(rows, args.group_extra, args.seed, args.swaps))
    print(f"train {len(data)} sequences", flush=True)
    t0 = time.perf_counter()
    model = train(arch, weights, data, args)
    train_s = time.perf_counter() - t0
    tensors_out = model.export()
    args.out.mkdir(parents=True, exist_ok=True)
    npz = args.out / f"{NAME}.npz"
    np.savez(npz, **tensors_out)
    meta = {"name": NAME, "layers": args.layers, "max_len": MAX_LEN, "base": identity,
            "word_embeddings": "embeddings.word_embeddings.weight of the base model, frozen",
            "input": "[CLS] cached [SEP] query [SEP], token types 0 / 1",
            "sha256": hashlib.sha256(npz.read_bytes()).hexdigest(),
            "train": {"sequences": len(data), "splits": sorted({r["split"] for r in rows}),
                      "seconds": round(train_s), "torch": torch.__version__,
                      **{k: v for k, v in vars(args).items()
                         if k in ("layers", "epochs", "batch", "lr", "dropout", "seed",
                                  "threads", "group_extra", "swaps")}}}
    (args.out / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {npz} ({npz.stat().st_size / 2**20:.1f} MiB) in {train_s:.0f} s")
    # the run-time graph (meshd.embed.pair_verifier) must give what torch gave
    from meshd.embed.pair_verifier import PairVerifier as Runtime

    runtime = Runtime(npz)
    probe = [(r["a"], r["b"], int(r["same"])) for r in rows[::97]]
    want = predict(model, encode(tok, probe))
    got = np.array([runtime.probability(a, b) for a, b, _ in probe])
    print(f"run-time graph vs torch on {len(probe)} pairs: max |dp| "
          f"{float(np.abs(got - want).max()):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
