"""Block-quantized weight matrices as onnxruntime's ``MatMulNBits`` reads them: pure NumPy.

A ``Blockwise`` holds an ``[N, K]`` weight matrix (Hugging Face ``[out, in]`` layout) cut along
K into blocks of ``block_size`` values, each block with a float scale, an integer zero point
and, where the source format has one, a float minimum:

    value[n, k] = scales[n, b] * (q[n, k] - zero_points[n, b]) + mins[n, b],  b = k // block_size

``q`` is packed as ``MatMulNBits`` wants it: ``[N, K / block_size, block_size * bits / 8]``
bytes, two 4-bit codes per byte (the even element in the low nibble) or one 8-bit code; the zero
points are ``uint8``, two per byte at 4 bits. ``MatMulNBits`` has no minimum term, so the graph
adds ``mins`` as a small second product of the block sums of the input (meshd.engine.graph):
that is what carries llama.cpp's "scale and minimum" formats (Q4_1, Q5_1, Q4_K, Q5_K) over
exactly; onnxruntime's float zero points would also express them but run 50x slower on CPU.

``from_gguf`` turns the raw blocks of a GGUF tensor into a ``Blockwise`` without rounding any
value: every supported GGUF format is a block scale times small integers (plus a block minimum),
so each maps onto 4 or 8 bits with the same scales. ``quantize`` makes a ``Blockwise`` from
float weights (``--dtype int4|int8`` and re-quantizing a GGUF at import). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshd.errors import ModelError

BLOCK = 32  # values per block of every 4/8-bit matrix meshd writes itself (as llama.cpp's Q4_0)


@dataclass(frozen=True)
class Blockwise:
    bits: int  # 4 or 8
    block_size: int
    q: np.ndarray  # uint8 [N, K / block_size, block_size * bits / 8]
    scales: np.ndarray  # float32 [N, K / block_size]
    zero_points: np.ndarray  # uint8 [N, ceil(K / block_size / 2)] at 4 bits, [N, K / bs] at 8
    mins: np.ndarray | None = None  # float32 [N, K / block_size]

    @property
    def shape(self) -> tuple[int, int]:
        n, kb, _ = self.q.shape
        return n, kb * self.block_size

    def codes(self) -> np.ndarray:
        """The unpacked integer codes, uint8 [N, K]."""
        return unpack_codes(self.q, self.bits).reshape(self.shape)

    def zero_point_values(self) -> np.ndarray:
        """The zero points unpacked, uint8 [N, K / block_size]."""
        n, kb, _ = self.q.shape
        if self.bits == 8:
            return self.zero_points
        return unpack_codes(self.zero_points, 4)[:, :kb]

    def dequantize(self) -> np.ndarray:
        """The float32 [N, K] matrix these blocks stand for."""
        n, kb, _ = self.q.shape
        codes = self.codes().reshape(n, kb, self.block_size).astype(np.float32)
        zp = self.zero_point_values().astype(np.float32)[:, :, None]
        out = self.scales[:, :, None] * (codes - zp)
        if self.mins is not None:
            out = out + self.mins[:, :, None]
        result: np.ndarray = out.reshape(n, kb * self.block_size).astype(np.float32)
        return result

    @property
    def nbytes(self) -> int:
        extra = self.mins.nbytes if self.mins is not None else 0
        return self.q.nbytes + self.scales.nbytes + self.zero_points.nbytes + extra


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack uint8 codes along the last axis (two 4-bit codes a byte, the even one low)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    if bits == 8:
        return codes
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return packed
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


def blockwise(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, bits: int,
              mins: np.ndarray | None = None) -> Blockwise:
    """Build from unpacked codes uint8 [N, kb, bs], scales [N, kb], zero points uint8 [N, kb]."""
    n, kb, bs = codes.shape
    return Blockwise(bits, bs, pack_codes(codes, bits).reshape(n, kb, bs * bits // 8),
                     np.ascontiguousarray(scales, np.float32),
                     pack_codes(zero_points, bits).reshape(n, -1),
                     None if mins is None else np.ascontiguousarray(mins, np.float32))


def quantize(w: np.ndarray, bits: int, block_size: int = BLOCK) -> Blockwise:
    """Round float weights [N, K] to ``bits`` per value, asymmetric per block (the block's range
    widened to include 0, so that 0 stays exact), as onnxruntime's own quantizer does."""
    if bits not in (4, 8):
        raise ValueError(f"bits={bits} (4 or 8)")
    w = np.asarray(w, np.float32)
    n, k = w.shape
    if k % block_size:
        raise ModelError(f"cannot quantize a [{n}, {k}] matrix in blocks of {block_size}")
    kb = k // block_size
    blocks = w.reshape(n, kb, block_size)
    top = float(2**bits - 1)
    lo = np.minimum(blocks.min(axis=-1), 0.0)
    hi = np.maximum(blocks.max(axis=-1), 0.0)
    scales = (hi - lo) / top
    safe = np.where(scales == 0, 1.0, scales)
    zp = np.clip(np.rint(-lo / safe), 0, top)
    codes = np.clip(np.rint(blocks / safe[..., None]) + zp[..., None], 0, top)
    return blockwise(codes.astype(np.uint8), scales.astype(np.float32), zp.astype(np.uint8), bits)


# ---------------------------------------------------------------------------------------------
# GGUF blocks. Each decoder takes the raw bytes of a tensor as uint8 [N, bytes per row] (ggml
# stores a 2-D tensor as N rows of K values, K cut into blocks) and returns (codes [N, kb, bs],
# scales, zero points, mins or None, bits). Layouts are ggml's (ggml-common.h), little-endian.

# (codes [N, kb, bs], scales [N, kb], zero points [N, kb], mins [N, kb] or None, bits)
_Decoded = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None", int]


def _f16(raw: np.ndarray) -> np.ndarray:
    """float16 fields (2 bytes, last axis) as float32."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(np.float32)


def _blocks(rows: np.ndarray, size: int) -> np.ndarray:
    n, nbytes = rows.shape
    if nbytes % size:
        raise ModelError(f"row of {nbytes} bytes is not a whole number of {size}-byte blocks")
    return rows.reshape(n, nbytes // size, size)


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 codes: the low nibbles are values 0-15, the high ones 16-31."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _q4_0(rows: np.ndarray) -> _Decoded:
    b = _blocks(rows, 18)
    codes = _nibbles_32(b[..., 2:])
    return codes, _f16(b[..., 0:2]), np.full(codes.shape[:2], 8, np.uint8), None, 4


def _q4_1(rows: np.ndarray) -> _Decoded:
    b = _blocks(rows, 20)
    codes = _nibbles_32(b[..., 4:])
    return codes, _f16(b[..., 0:2]), np.zeros(codes.shape[:2], np.uint8), _f16(b[..., 2:4]), 4


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes (a little-endian uint32) -> the 5th bit of each of 32 values, as 0 or 16."""
    word = np.ascontiguousarray(qh).view("<u4")[..., 0]
    shifts = np.arange(32, dtype=np.uint32)
    return (((word[..., None] >> shifts) & 1) << 4).astype(np.uint8)


def _q5_0(rows: np.ndarray) -> _Decoded:
    b = _blocks(rows, 22)
    codes = _nibbles_32(b[..., 6:]) | _fifth_bits(b[..., 2:6])
    return codes, _f16(b[..., 0:2]), np.full(codes.shape[:2], 16, np.uint8), None, 8


def _q5_1(rows: np.ndarray) -> _Decoded:
    b = _blocks(rows, 24)
    codes = _nibbles_32(b[..., 8:]) | _fifth_bits(b[..., 4:8])
    return codes, _f16(b[..., 0:2]), np.zeros(codes.shape[:2], np.uint8), _f16(b[..., 2:4]), 8


def _q8_0(rows: np.ndarray) -> _Decoded:
    b = _blocks(rows, 34)
    codes = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return codes, _f16(b[..., 0:2]), np.full(codes.shape[:2], 128, np.uint8), None, 8


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins packed in 12 bytes of a Q4_K/Q5_K super-block."""
    s = s.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _k_blocks(d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray,
              codes: np.ndarray, bits: int) -> _Decoded:
    """Super-blocks [N, S, 256] with 8 sub-scales/mins each -> blocks of 32."""
    n, s = d.shape
    scales = (d[..., None] * sc.astype(np.float32)).reshape(n, s * 8)
    mins = (-(dmin[..., None] * mn.astype(np.float32))).reshape(n, s * 8)
    return (codes.reshape(n, s * 8, 32), scales, np.zeros((n, s * 8), np.uint8), mins, bits)


def _q4_k(rows: np.ndarray) -> _Decoded:
    b = _blocks(rows, 144)
    sc, mn = _k_scales_mins(b[..., 4:16])
    qs = b[..., 16:].reshape(b.shape[:2] + (4, 32))  # 4 chunks of 64 values
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=-1)  # each chunk: 32 low, then 32 high
    return _k_blocks(_f16(b[..., 0:2]), _f16(b[..., 2:4]), sc, mn, codes, 4)


def _q5_k(rows: np.ndarray) -> _Decoded:
    b = _blocks(rows, 176)
    sc, mn = _k_scales_mins(b[..., 4:16])
    qh = b[..., 16:48]  # [N, S, 32]: bit 2j of byte l is value l of chunk j's low half
    qs = b[..., 48:].reshape(b.shape[:2] + (4, 32))
    chunk = np.arange(4, dtype=np.uint8)[:, None]
    hi_lo = ((qh[..., None, :] >> (2 * chunk)) & 1) << 4
    hi_hi = ((qh[..., None, :] >> (2 * chunk + 1)) & 1) << 4
    codes = np.concatenate([(qs & 0xF) | hi_lo, (qs >> 4) | hi_hi], axis=-1)
    return _k_blocks(_f16(b[..., 0:2]), _f16(b[..., 2:4]), sc, mn, codes, 8)


def _q6_k(rows: np.ndarray) -> _Decoded:
    b = _blocks(rows, 210)
    n, s, _ = b.shape
    ql = b[..., 0:128].reshape(n, s, 2, 64)  # two halves of 128 values
    qh = b[..., 128:192].reshape(n, s, 2, 32)
    sub = b[..., 192:208].view(np.int8).astype(np.float32)  # 16 scales, one per 16 values
    d = _f16(b[..., 208:210])
    # within a half: values [0,32) low nibbles of ql[0:32], [32,64) low of ql[32:64],
    # [64,96) high of ql[0:32], [96,128) high of ql[32:64]; 2 high bits each from qh
    parts = [(ql[..., 0:32] & 0xF) | (((qh >> 0) & 3) << 4),
             (ql[..., 32:64] & 0xF) | (((qh >> 2) & 3) << 4),
             (ql[..., 0:32] >> 4) | (((qh >> 4) & 3) << 4),
             (ql[..., 32:64] >> 4) | (((qh >> 6) & 3) << 4)]
    codes = np.concatenate(parts, axis=-1).reshape(n, s * 16, 16).astype(np.uint8)
    scales = (d[..., None] * sub).reshape(n, s * 16)
    return codes, scales, np.full((n, s * 16), 32, np.uint8), None, 8


GGUF_BLOCK_DECODERS = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}
# GGUF's plain float types (read as arrays, not blocks)
GGUF_FLOAT_TYPES = ("F32", "F16", "BF16")


def from_gguf(type_name: str, rows: np.ndarray) -> Blockwise:
    """The blocks of a GGUF tensor of type ``type_name`` (raw bytes, uint8 [N, bytes per row])
    as a ``Blockwise``, values unchanged."""
    decode = GGUF_BLOCK_DECODERS.get(type_name)
    if decode is None:
        raise ModelError(
            f"GGUF tensor type {type_name} is not supported (supported: "
            f"{', '.join([*GGUF_FLOAT_TYPES, *GGUF_BLOCK_DECODERS])})")
    codes, scales, zp, mins, bits = decode(np.ascontiguousarray(rows, np.uint8))
    return blockwise(codes, scales, zp, bits, mins)
