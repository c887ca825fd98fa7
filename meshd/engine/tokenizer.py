"""The model's tokenizer (``tokenizer.json`` via the ``tokenizers`` library), its chat template,
and streaming helpers: incremental detokenisation and stop-string hold-back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from meshd.engine.manifest import TokenizerInfo
from meshd.errors import LocalError, ModelError


class Tokenizer:
    def __init__(self, path: Path | None, info: TokenizerInfo, *, data: bytes | None = None) -> None:
        """Load ``tokenizer.json`` from ``path``, or from its bytes ``data`` (a tokenizer fetched
        from a peer: meshd.node.tokenizers)."""
        from tokenizers import Tokenizer as _HfTokenizer

        where = path.name if path is not None else info.file
        try:
            if data is not None:
                self._tok = _HfTokenizer.from_str(data.decode("utf-8"))
            else:
                assert path is not None
                self._tok = _HfTokenizer.from_file(str(path))
        except Exception as err:  # the library raises a bare Exception on any parse error
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ModelError(f"{where}: cannot load tokenizer ({first})") from None
        self.info = info
        self._template: Any = None

    @property
    def bos_token_id(self) -> int | None:
        return self.info.bos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.info.eos_token_ids

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def has_chat_template(self) -> bool:
        return bool(self.info.chat_template)

    @property
    def hf(self) -> Any:
        """The ``tokenizers.Tokenizer`` underneath (llguidance's view calls into it)."""
        return self._tok

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` text."""
        return str(self._tok.to_str())

    def token_text(self, token_id: int) -> str:
        """One token's own text, special tokens included (for log probabilities)."""
        return str(self._tok.decode([token_id], skip_special_tokens=False))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens (such as BOS) as the tokenizer's own
        post-processor adds them."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Render ``messages`` (each ``{"role": ..., "content": ...}``, an assistant message may
        carry ``tool_calls``, a tool message ``tool_call_id``) with the model's chat template, as
        Hugging Face's ``apply_chat_template`` does (sandboxed Jinja, its ``tojson``): ``tools``
        (OpenAI's ``{"type": "function", "function": {...}}`` objects) go to the template as its
        ``tools`` variable, for a template with tool syntax (meshd.api.tool_template)."""
        if not self.info.chat_template:
            raise LocalError("this model ships no chat template")
        if self._template is None:
            self._template = compile_template(self.info.chat_template)
        try:
            return str(self._template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools else None,
                bos_token=self.info.bos_token or "", eos_token=self.info.eos_token or "",
            ))
        except Exception as err:  # template errors, raise_exception() inside the template
            raise ModelError(f"chat template failed: {err}") from None

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Token ids of a chat prompt (the template writes any BOS itself)."""
        return self.encode(self.apply_chat_template(messages, tools=tools),
                           add_special_tokens=False)

    def encode_prompt(self, text: str, *, chat: bool = False) -> list[int]:
        """Token ids of a text prompt: as one user message through the chat template when
        ``chat`` is true. The one rule for serving nodes and entry nodes alike."""
        if chat:
            return self.encode_chat([{"role": "user", "content": text}])
        return self.encode(text)


def compile_template(source: str) -> Any:
    """A chat template's source compiled as Hugging Face compiles it (sandboxed Jinja, its
    ``tojson``, ``raise_exception``, ``strftime_now``); ModelError if it does not compile."""
    try:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise LocalError("chat templates need the 'jinja2' package") from None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def strftime_now(fmt: str) -> str:  # Llama 3.x templates print today's date
        import datetime

        return datetime.datetime.now().strftime(fmt)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        # Hugging Face's filter: Jinja's own escapes <, >, & and ' for HTML and sorts keys,
        # which would render the tools and the calls unlike the model was trained on
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except TemplateError as err:
        raise ModelError(f"chat template does not compile: {err}") from None


class IncrementalDecoder:
    """Turn a stream of token ids into text pieces whose concatenation is the decoded text.

    A piece is held back while it ends in an incomplete UTF-8 sequence. ``context`` (the last few
    prompt tokens) makes the first piece keep its leading space, which tokenizers drop at the
    start of a text.
    """

    def __init__(self, tokenizer: Tokenizer, context: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids = list(context)
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._tok.decode(self._ids[self._prefix:self._read])
        full = self._tok.decode(self._ids[self._prefix:])
        if full.endswith("\ufffd") or len(full) < len(before):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return full[len(before):]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        before = self._tok.decode(self._ids[self._prefix:self._read])
        full = self._tok.decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return full[len(before):] if len(full) > len(before) else ""


class StopChecker:
    """Release text as it streams, holding back any tail that could begin a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text that is safe to emit now; sets ``stopped`` when a stop string appears."""
        buf = self._held + piece
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buf[:min(hits)]
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:n]):
                    hold = n
                    break
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold]

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out
