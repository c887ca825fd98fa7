"""Ask an upstream server what it is (``meshd.upstream.facts``), and find its exact tokenizer.

``probe`` makes at most four small HTTP calls: ``GET /props`` (llama-server), ``POST /tokenize``
(vLLM), ``GET /v1/models`` (everyone) and, for vLLM, a one-token generation that shows whether
its stream returns token ids. The caller bounds it with a deadline.

``GgufTokenizer`` (llama-server only): when the GGUF file the server reports is readable on this
host, its tokenizer is built from the file's metadata by the same code ``meshd model import``
uses (``meshd.engine.gguf_vocab``), so its identity is the one a native import of that file
advertises; ``verify`` then checks it against the server's own ``/tokenize`` on a few strings
(and throws it away on any difference: tokenization goes through the server instead). Reading
the metadata of a large vocabulary takes seconds: it runs in a worker thread, once per file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from meshd.errors import LocalError, MeshdError, PeerGoneError, RemoteError
from meshd.upstream import facts as F
from meshd.upstream import llamacpp

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# strings the local tokenizer must split exactly as the server does: words, spacing, digits,
# non-Latin scripts, an emoji, and special-token text
VERIFY_TEXTS = ("Hello, world! It's 2024.", "  two  spaces\n\nnew lines\tand a tab",
                "Grüße, ciudad 東京 123456 🙂", "<|im_start|>user\nHi<|im_end|>")


async def _json(client: httpx.AsyncClient, method: str, url: str,
                body: dict[str, Any] | None = None) -> Any:
    """The JSON of a 200 answer; None for any other status or a body that is not JSON.
    ``PeerGoneError`` when the server cannot be reached or answers nothing in time."""
    try:
        r = await client.request(method, url, json=body)
    except httpx.TimeoutException:
        raise PeerGoneError(f"upstream {url} timed out") from None
    except httpx.TransportError as e:
        raise PeerGoneError(f"upstream {url} unreachable: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403):
        raise RemoteError(f"upstream {url} answered {r.status_code} (check upstream_key_file)",
                          "internal")
    if r.status_code != 200:
        return None
    try:
        return r.json()
    except ValueError:
        return None


async def probe(client: httpx.AsyncClient, base_url: str, upstream_model: str) -> F.ServerFacts:
    """What the server at ``base_url`` (its OpenAI base URL) is."""
    root = F.root_url(base_url)
    props = await _json(client, "GET", root + "/props")
    if F.is_llama_cpp(props):
        models = await _json(client, "GET", base_url + "/models")
        return F.llama_cpp_facts(props, models)
    tok = await _json(client, "POST", root + "/tokenize", {"model": upstream_model, "prompt": "Hi"})
    models = await _json(client, "GET", base_url + "/models")
    if F.is_vllm_tokenize(tok):
        return F.vllm_facts(tok, models, upstream_model)
    if models is None:
        raise PeerGoneError(f"upstream {base_url} answered none of /props, /tokenize and /models "
                            "as an OpenAI-compatible server would")
    return F.openai_facts(models, upstream_model)


async def vllm_returns_ids(client: httpx.AsyncClient, base_url: str, upstream_model: str,
                           ids: list[int]) -> bool:
    """Whether vLLM's completions return token ids (``return_token_ids``, vLLM >= 0.10.2): one
    token generated from ``ids``, not streamed."""
    body = {"model": upstream_model, "prompt": ids, "max_tokens": 1, "temperature": 0,
            "return_token_ids": True}
    answer = await _json(client, "POST", base_url + "/completions", body)
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    return isinstance(choices[0].get("token_ids"), list)


@dataclass
class GgufTokenizer:
    """The exact tokenizer of a GGUF file (an engine ``Tokenizer``), its identity and bundle."""

    path: str
    stamp: tuple[int, int]  # (size, mtime_ns) of the file when it was read
    sha256: str
    tokenizer: Any
    identity: str
    bundle: bytes


def file_stamp(path: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of the GGUF file at ``path``; None when it is not readable here or not
    a GGUF file (its first bytes are not ``GGUF``): the path comes from the server, and no other
    file of this host is ever hashed or read for it."""
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                return None
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_loaded: dict[tuple[str, tuple[int, int]], GgufTokenizer] = {}  # one read per file and process
_loading = threading.Lock()


def load_gguf_tokenizer(path: str) -> GgufTokenizer:
    """Blocking (hashes the file, parses its metadata): call it from a worker thread. Raises
    ``LocalError`` when this meshd cannot read GGUF vocabularies, ``ModelError`` for a file it
    cannot use, ``OSError`` when the file cannot be read. Models of one node fronting servers
    of one file read it once."""
    with _loading:
        stamp = file_stamp(path)
        held = _loaded.get((path, stamp)) if stamp is not None else None
        if held is None:
            held = _read_gguf_tokenizer(path)
            _loaded[(path, held.stamp)] = held
        return held


def _read_gguf_tokenizer(path: str) -> GgufTokenizer:
    try:
        from meshd.engine.gguf_meta import read_gguf_metadata
        from meshd.engine.gguf_vocab import tokenizer_from_gguf
    except ImportError:
        raise LocalError("this meshd cannot read GGUF vocabularies (no meshd.engine.gguf_vocab)") from None
    from meshd.core.tokident import TokenizerMeta, encode_bundle, tokenizer_identity
    from meshd.engine.manifest import TokenizerInfo
    from meshd.engine.tokenizer import Tokenizer

    stamp = file_stamp(path)
    if stamp is None:
        raise OSError(f"{path}: not readable here")
    digest = sha256_file(path)
    g = tokenizer_from_gguf(read_gguf_metadata(Path(path)))
    data = g.tokenizer_json.encode()
    meta = TokenizerMeta(g.bos_token_id, tuple(g.eos_token_ids), g.bos_token, g.eos_token,
                         g.chat_template)
    info = TokenizerInfo(file="tokenizer.json", sha256=hashlib.sha256(data).hexdigest(),
                         bos_token_id=g.bos_token_id, eos_token_ids=tuple(g.eos_token_ids),
                         bos_token=g.bos_token, eos_token=g.eos_token, chat_template=g.chat_template)
    return GgufTokenizer(path, stamp, digest, Tokenizer(None, info, data=data),
                         tokenizer_identity(data, meta), encode_bundle(data, meta))


async def verify(client: httpx.AsyncClient, root: str, tok: Any) -> str:
    """"" when ``tok`` splits every ``VERIFY_TEXTS`` string as the server's ``/tokenize`` does,
    else the first difference."""
    for text in VERIFY_TEXTS:
        answer = await _json(client, "POST", root + "/tokenize",
                             llamacpp.tokenize_body(text, add_special=True))
        if answer is None:
            return "its /tokenize did not answer"
        theirs = llamacpp.token_list(answer, root)
        ours = list(tok.encode(text, add_special_tokens=True))
        if ours != theirs:
            return f"{text!r}: server {theirs[:12]}, GGUF tokenizer {ours[:12]}"
    return ""


def gguf_digest_only(path: str) -> str:
    """The sha256 of the GGUF file at ``path`` ("" when it cannot be read here or is not a GGUF
    file). Blocking."""
    if file_stamp(path) is None:
        return ""
    try:
        return sha256_file(path)
    except OSError:
        return ""


def describe(err: BaseException) -> str:
    """One line for a probe's failure (statistics and the log)."""
    if isinstance(err, MeshdError | OSError):
        return str(err) or type(err).__name__
    return f"{type(err).__name__}: {err}"


__all__ = ["GgufTokenizer", "describe", "file_stamp", "gguf_digest_only",
           "load_gguf_tokenizer", "probe", "verify", "vllm_returns_ids"]
