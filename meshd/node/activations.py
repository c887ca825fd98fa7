"""Activations on the wire: what a ``STAGE_STEP`` frame carries, encoded and checked.

A stage step carries one tensor as ``dtype``, ``shape`` and raw little-endian ``data``:

- ``"i64"``, shape ``[T]``: token ids, into a first stage;
- ``"f16"``, shape ``[T, hidden]``: hidden states as IEEE half floats (the default between
  stages: 2 bytes per value, and greedy output stays identical to a single node's on the shipped
  model, see docs/pipeline.md);
- ``"q8"``, shape ``[T, hidden]``: per-row absmax int8: ``T`` float32 scales, then ``T x hidden``
  int8 values (about half of f16 again; lossy enough to change greedy output, so opt-in);
- ``"f32"``, shape ``[T, hidden]``: full precision, for debugging and comparisons.

``decode_tensor`` raises only ``RemoteError`` with code ``bad_tensor`` (or ``too_large``), with
one line that says what was wrong: an unknown dtype, a shape that is not what the receiving
stage takes, a byte count that does not match the shape, a value that is not finite, a token
id outside the vocabulary. Pure: numpy in, numpy out, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshd.errors import ErrorCode, RemoteError

WIRE_DTYPES = ("f16", "q8", "f32")
MAX_TOKENS_PER_STEP = 1 << 14
_ITEM = {"i64": 8, "f16": 2, "f32": 4}


class TensorError(RemoteError):
    """A received activation tensor is malformed, of the wrong shape, or not finite."""

    code = ErrorCode.BAD_TENSOR


def encode_ids(ids: Sequence[int]) -> tuple[str, list[int], bytes]:
    """Token ids as a step's (dtype, shape, data)."""
    arr = np.asarray(list(ids), dtype="<i8")
    return "i64", [int(arr.shape[0])], arr.tobytes()


def encode_hidden(h: np.ndarray, dtype: str = "f16") -> tuple[str, list[int], bytes]:
    """Hidden states ``[T, hidden]`` as a step's (dtype, shape, data)."""
    if h.ndim != 2:
        raise ValueError(f"hidden states must be 2-D, got shape {list(h.shape)}")
    shape = [int(h.shape[0]), int(h.shape[1])]
    if dtype == "f16":
        return dtype, shape, np.ascontiguousarray(h, dtype="<f2").tobytes()
    if dtype == "f32":
        return dtype, shape, np.ascontiguousarray(h, dtype="<f4").tobytes()
    if dtype == "q8":
        x = np.asarray(h, dtype=np.float32)
        scale = np.abs(x).max(axis=1) / 127.0
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(x / scale[:, None]), -127, 127).astype(np.int8)
        return dtype, shape, scale.astype("<f4").tobytes() + q.tobytes()
    raise ValueError(f"unknown activation dtype {dtype!r} (one of {', '.join(WIRE_DTYPES)})")


def _expect_bytes(dtype: str, shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    if dtype == "q8":
        return shape[0] * 4 + n
    return n * _ITEM[dtype]


def decode_tensor(
    dtype: object,
    shape: object,
    data: object,
    *,
    tokens: int,
    hidden: int | None,
    vocab: int,
) -> np.ndarray:
    """Check and decode one step's tensor for a stage.

    ``tokens`` is how many positions the step claims; ``hidden`` is None for a first stage
    (which takes token ids ``[tokens]``) and the hidden size otherwise. Returns int64 ids or
    float32 hidden states. Raises ``TensorError`` on anything wrong, never anything else.
    """
    if not isinstance(dtype, str) or not isinstance(data, bytes | bytearray | memoryview):
        raise TensorError("activation frame needs a string dtype and binary data")
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        raise TensorError("activation shape must be a list of integers")
    shape = [int(d) for d in shape]
    if not 1 <= tokens <= MAX_TOKENS_PER_STEP:
        raise TensorError(f"a step must carry 1 to {MAX_TOKENS_PER_STEP} positions, got {tokens}")
    if hidden is None:
        if dtype != "i64":
            raise TensorError(f"a first stage takes token ids (i64), got {dtype}")
        if shape != [tokens]:
            raise TensorError(f"token ids must have shape [{tokens}], got {shape}")
    else:
        if dtype not in WIRE_DTYPES:
            raise TensorError(
                f"unknown activation dtype {dtype!r} (one of {', '.join(WIRE_DTYPES)})"
            )
        if shape != [tokens, hidden]:
            raise TensorError(f"hidden states must have shape [{tokens}, {hidden}], got {shape}")
    need = _expect_bytes(dtype, shape)
    if len(data) != need:
        raise TensorError(f"{dtype}{shape} needs {need} bytes of data, got {len(data)}")
    raw = bytes(data)
    if dtype == "i64":
        ids = np.frombuffer(raw, dtype="<i8").astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise TensorError(f"token id outside the vocabulary [0, {vocab})")
        return ids
    if dtype == "q8":
        t = shape[0]
        scale = np.frombuffer(raw[: 4 * t], dtype="<f4")
        q = np.frombuffer(raw[4 * t :], dtype=np.int8).reshape(shape)
        if not np.all(np.isfinite(scale)):
            raise TensorError("activation scales are not all finite")
        out = q.astype(np.float32) * scale.astype(np.float32)[:, None]
    else:
        out = np.frombuffer(raw, dtype="<f2" if dtype == "f16" else "<f4").reshape(shape)
        out = out.astype(np.float32)
    if not np.all(np.isfinite(out)):
        raise TensorError("activations hold NaN or infinite values")
    return out
