"""How many tokens a request may generate: one rule, applied at the entry node.

``token_budget(prompt_tokens, asked, context)``:

- nothing asked: ``DEFAULT_MAX_TOKENS``, cut to what the context leaves after the prompt;
- asked over ``MAX_MAX_TOKENS``: clamped to it, and the note says so (the client sees it);
- the prompt plus what is asked (clamped) over the model's context: refused with both numbers
  (``ContextLengthError``, code ``context_length_exceeded``), before anything is forwarded. The
  message quotes max_tokens as the client sent it, and the clamp when there was one (the
  refused client never sees the note), so the control socket and the HTTP API say the same.

``asked <= 0`` never gets here: ``meshd.core.request.parse_submit`` refuses it. Pure.
"""

from __future__ import annotations

from meshd.core.request import DEFAULT_MAX_TOKENS, MAX_MAX_TOKENS
from meshd.errors import ContextLengthError


def token_budget(prompt_tokens: int, asked: int | None, context: int | None) -> tuple[int, str | None]:
    """``(max_tokens, note)``: what the request will generate at most, and a line saying why it
    differs from what was asked (None when it does not). ``context`` None: not known here (the
    serving node checks it)."""
    room = context - prompt_tokens if context else None
    if room is not None and room < 1:
        raise ContextLengthError(
            f"the prompt is {prompt_tokens} tokens and the model's context is {context}: "
            f"no room to generate", prompt_tokens=prompt_tokens, max_tokens=asked or 0,
            context=context or 0)
    if asked is None:
        return (DEFAULT_MAX_TOKENS if room is None else min(DEFAULT_MAX_TOKENS, room)), None
    note = None
    want = asked
    clamp = f"clamped to {MAX_MAX_TOKENS}, the most one request may ask for"
    if want > MAX_MAX_TOKENS:
        want = MAX_MAX_TOKENS
        note = f"max_tokens {asked} {clamp}"
    if room is not None and want > room:
        clamped = f" ({clamp})" if want != asked else ""
        raise ContextLengthError(
            f"the prompt is {prompt_tokens} tokens and max_tokens is {asked}{clamped}: "
            f"{prompt_tokens + want} is over the model's context of {context} tokens; "
            f"ask for at most {room}",
            prompt_tokens=prompt_tokens, max_tokens=asked, context=context or 0)
    return want, note
