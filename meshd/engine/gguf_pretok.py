"""The pre-tokenizer splits llama.cpp applies to a byte-level BPE vocabulary, keyed on the GGUF
``tokenizer.ggml.pre`` value.

llama.cpp cuts the text with each regex in turn (every piece of one cut is cut again by the next;
text no regex matches stays a piece of its own), byte-encodes the pieces and runs BPE in each.
The ``tokenizers`` library does the same with one ``Split`` (behaviour ``Isolated``) per regex
and a ``ByteLevel`` step without its own regex. The regexes below are those of llama.cpp's
``llm_tokenizer_bpe`` for the supported values, written in the ``tokenizers`` (Oniguruma) syntax;
``\\p{L}``, ``\\p{N}``, ``\\p{P}`` and ``\\s`` mean what they mean in Unicode there and in
llama.cpp's tables. The case-insensitive contractions of Llama 3 and Qwen 2 are spelled out
(``'[sS]``), as llama.cpp spells them.

Values not listed are refused by name: llama.cpp knows many more, each with its own regexes and
quirks, and a wrong split silently changes every encoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshd.errors import ModelError

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a piece that is a whole token is that token (Llama 3)
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token


_GPT2 = PreTokenizer((GPT2,))
_STARCODER = PreTokenizer((r"\p{N}", GPT2))  # every digit on its own, then GPT-2's split
_LLAMA3 = PreTokenizer((LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2 = PreTokenizer((QWEN2,))
_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4"), _GPT2),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b", "mellum2"), _STARCODER),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"), _LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreTokenizer((LLAMA3,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"), _QWEN2),
}


def pre_tokenizer(pre: str) -> PreTokenizer:
    """The split for the GGUF ``tokenizer.ggml.pre`` value ``pre``; a ``ModelError`` naming it
    when meshd has none."""
    try:
        return PRE_TOKENIZERS[pre]
    except KeyError:
        raise ModelError(f"unsupported GGUF pre-tokenizer: tokenizer.ggml.pre = {pre!r} "
                         f"(meshd reads {', '.join(sorted(PRE_TOKENIZERS))})") from None
