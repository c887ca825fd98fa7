"""How fast a node prefills a finished answer again to keep its KV (``[engine] keep_answers``).
Pure: the batch scheduler (``meshd.engine.scheduler``) and the simulator (``meshd.sim.prefixes``)
decide with it alike.

Only prefilled KV is reused (a decode step's keys and values come from other kernels), so a node
keeping an answer prefills the prompt's tail and the answer once more. That work is for a next
turn that may never come or may land elsewhere, so it must not slow the streams decoding now by
much: with no stream decoding it runs in whole prefill chunks; beside decoding streams, a chunk
may add at most ``STEP_SHARE`` of their step's measured time, in multiples of
``CHUNK_MULTIPLE`` tokens, and where not even one multiple fits (a device whose prefill is slow
against its decode step, such as a CPU), the answer waits for a step with no stream.
"""

from __future__ import annotations

STEP_SHARE = 0.25  # of the running streams' decode step a finished answer's chunk may add
QUEUE = 16  # finished answers waiting to be kept, at most: the oldest is dropped past this
CHUNK_MULTIPLE = 16  # tokens: every prefill chunk is a whole multiple of this (the scheduler's too)


def answer_chunk(step_ms: float, prefill_ms_per_token: float, full_chunk: int,
                 streams: int) -> int:
    """Tokens of a finished answer to prefill in this step: ``full_chunk`` with no stream
    decoding (``streams`` 0); beside streams whose step takes ``step_ms``, what adds at most
    ``STEP_SHARE`` of it at ``prefill_ms_per_token``, in multiples of ``CHUNK_MULTIPLE``, at most
    ``full_chunk``. 0: none this step (or a speed is not measured yet)."""
    if streams <= 0:
        return full_chunk
    if step_ms <= 0 or prefill_ms_per_token <= 0:
        return 0
    fits = int(STEP_SHARE * step_ms / prefill_ms_per_token) // CHUNK_MULTIPLE * CHUNK_MULTIPLE
    return min(full_chunk, fits)


def answer_seconds(tokens: int, step_s: float, prefill_tps: float, streams: int) -> float | None:
    """Seconds to prefill ``tokens`` of a finished answer on a device that prefills
    ``prefill_tps`` tokens a second alone, beside ``streams`` decoding streams whose step takes
    ``step_s`` (the simulator's view of ``answer_chunk``, at steady speeds): None when its chunks
    do not fit beside the streams (it waits for a step with none)."""
    if tokens <= 0:
        return 0.0
    if streams <= 0:
        return tokens / prefill_tps
    per_step = answer_chunk(step_s * 1000.0, 1000.0 / prefill_tps, 1 << 30, streams)
    if per_step <= 0:
        return None
    return -(-tokens // per_step) * (step_s + per_step / prefill_tps)  # each step made longer
