"""meshd.engine.quant: GGUF blocks carried over to MatMulNBits blocks without changing a value,
checked against the `gguf` package's own dequantizer, and the float quantizer's error bound."""

from __future__ import annotations

import numpy as np
import pytest

from meshd.engine import quant
from meshd.errors import ModelError

gguf = pytest.importorskip("gguf")

# bytes per block and where its float16 fields lie (byte offsets)
_LAYOUT = {"Q4_0": (18, (0,)), "Q4_1": (20, (0, 2)), "Q5_0": (22, (0,)), "Q5_1": (24, (0, 2)),
           "Q8_0": (34, (0,)), "Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)),
           "Q6_K": (210, (208,))}


def random_rows(type_name: str, n: int, k: int, seed: int = 0, scale: float = 0.02) -> np.ndarray:
    """Random valid GGUF blocks: random code bytes, finite float16 scales."""
    size, f16_at = _LAYOUT[type_name]
    per = 256 if type_name.endswith("_K") else 32
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // per, size), dtype=np.uint8)
    for at in f16_at:
        raw[..., at:at + 2] = (rng.standard_normal((n, k // per)) * scale
                               ).astype("<f2")[..., None].view(np.uint8)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("type_name", sorted(_LAYOUT))
def test_gguf_blocks_keep_every_value(type_name: str) -> None:
    rows = random_rows(type_name, 6, 512)
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    want = gguf.quants.dequantize(rows, qtype).astype(np.float32)
    got = quant.from_gguf(type_name, rows)
    assert got.shape == want.shape == (6, 512)
    # the same products in float32, summed in another order at most
    np.testing.assert_allclose(got.dequantize(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("type_name,bits,block", [("Q4_0", 4, 32), ("Q4_1", 4, 32),
                                                   ("Q8_0", 8, 32), ("Q4_K", 4, 32),
                                                   ("Q5_K", 8, 32), ("Q6_K", 8, 16),
                                                   ("Q5_0", 8, 32)])
def test_each_format_lands_on_its_width(type_name: str, bits: int, block: int) -> None:
    b = quant.from_gguf(type_name, random_rows(type_name, 2, 256))
    assert (b.bits, b.block_size) == (bits, block)
    assert (b.mins is not None) == (type_name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"))


def test_unknown_gguf_type_is_refused_by_name() -> None:
    with pytest.raises(ModelError, match="IQ2_XS is not supported"):
        quant.from_gguf("IQ2_XS", np.zeros((1, 66), np.uint8))


@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_error_is_within_half_a_step(bits: int) -> None:
    w = np.random.default_rng(1).standard_normal((16, 128)).astype(np.float32)
    b = quant.quantize(w, bits)
    step = b.scales.repeat(32, axis=1)
    assert np.all(np.abs(b.dequantize() - w) <= step / 2 + 1e-6)
    assert np.all(b.zero_point_values() <= 2**bits - 1)


def test_zero_stays_exact_and_packing_round_trips() -> None:
    w = np.zeros((3, 64), np.float32)
    w[0, 5] = 1.0
    b = quant.quantize(w, 4)
    np.testing.assert_array_equal(b.dequantize()[:, :5], 0.0)
    codes = np.random.default_rng(2).integers(0, 16, (4, 2, 32)).astype(np.uint8)
    assert np.array_equal(quant.unpack_codes(quant.pack_codes(codes, 4), 4), codes)
