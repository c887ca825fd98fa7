"""Advert schema: round trip, caps, and rejection of malformed bodies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.core.advert import Advert, ModelAdvert, decode_advert
from meshd.core.wire import pack
from meshd.errors import ProtocolError


def make(**kw: object) -> Advert:
    base: dict[str, object] = dict(
        peer_id="12D3KooWtest", name="gw-1", seq=1_700_000_000_000, ts=1.7e9, region="eu",
        labels={"region": "eu"}, addrs=("/ip4/127.0.0.1/tcp/1",),
        hardware={"kind": "cpu", "cpu_cores": 2},
        models=(ModelAdvert("tiny", 6, 0, 6, 500.0, 40.0, 1000, 192),),
        queue_depth=3, in_flight=1, coord=(1.0, 2.0), coord_height=0.5, coord_error=0.2,
    )
    base.update(kw)
    return Advert(**base)  # type: ignore[arg-type]


def test_round_trip() -> None:
    a = make()
    assert decode_advert(a.encode()) == a


def test_size_cap() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        make(hardware={"blob": "x" * 9000}).encode()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.pop("seq"), "lacks 'seq'"),
        (lambda d: d.update(seq=-1), "out of range"),
        (lambda d: d.update(queue=True), "wrong type"),
        (lambda d: d.update(models=[{"name": "m", "num_layers": 4, "layers": [3, 9]}]), "outside"),
        (lambda d: d.update(prefill_tps=float("nan")), "out of range"),
        (lambda d: d.update(coord={"vec": [float("inf")]}), "finite"),
        (lambda d: d.update(labels={"a": 1}), "labels"),
    ],
)
def test_rejects(mutate, match: str) -> None:  # type: ignore[no-untyped-def]
    d = make().to_dict()
    mutate(d)
    with pytest.raises(ProtocolError, match=match):
        decode_advert(pack(d))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["v", "peer_id", "name", "seq", "ts", "models", "labels",
                                        "coord", "queue", "addrs", "hw", "slots"]),
                       st.none() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5) | st.lists(st.integers(0, 2**32), max_size=3)
                       | st.dictionaries(st.text(max_size=3), st.integers(0, 2**32), max_size=2)))
def test_garbage_raises_only_protocol_error(d: dict[str, object]) -> None:
    try:
        decode_advert(pack(d))
    except ProtocolError:
        pass


def test_measured_service_rate_travels_and_an_older_advert_without_it_reads_as_unmeasured() -> None:
    from meshd.node.view import view_of_advert

    a = make(service_rate_rps=3.25)
    back = decode_advert(a.encode())
    assert back.service_rate_rps == 3.25
    view = view_of_advert(back, rtt_ms=1.0, rtt_source="measured", age_s=0.0,
                          sent_since_advert=0, is_local=False)
    assert view.service_rate_rps == 3.25  # the router takes it as measured
    d = a.to_dict()
    del d["svc_rps"]  # an advert from before the field
    assert decode_advert(pack(d)).service_rate_rps == 0.0


def test_collections_travel_and_an_advert_without_them_reads_as_none() -> None:
    from meshd.core.advert import MAX_COLLECTIONS

    a = make(collections=("docs", "kjv"))
    assert decode_advert(a.encode()).collections == ("docs", "kjv")
    d = make().to_dict()
    assert "rag" not in d  # optional: older nodes never see the key
    assert decode_advert(make().encode()).collections == ()
    for bad in (["x" * 65], [""], [1], ["c"] * (MAX_COLLECTIONS + 1), "docs"):
        with pytest.raises(ProtocolError, match="rag"):
            decode_advert(pack({**d, "rag": bad}))


def test_live_hardware_and_kv_bytes_travel_and_older_adverts_read_as_unknown() -> None:
    from meshd.core.hwsignals import read_signals
    from meshd.telemetry import GpuInfo, Hardware

    gpus = tuple(GpuInfo(i, "NVIDIA H100 80GB HBM3", 80 << 30, 70 << 30, 55.0, 61.0, "550.54.15",
                         False, 10 << 30, 312.5, 700.0, 0.93, ("sw_power_cap", "hw_thermal"))
                 for i in range(8))
    hw = Hardware("nvidia", 224, "AMD EPYC 9654 96-Core Processor", 2 << 40, 1 << 40, gpus,
                  tuple(sorted((f"zone{i}", 40.0 + i) for i in range(16))), cpu_load_1m=12.5,
                  power_w=350.0, cpu_clock_ratio=0.9, throttle=("thermal:x86_pkg_temp",),
                  kv_memory="gpu")
    models = tuple(ModelAdvert(f"model-{i}", 80, 0, 80, 9000.0, 60.0, 100_000, 8192,
                               kv_bytes_per_token=327_680) for i in range(4))
    a = make(hardware=hw.to_dict(), models=models)
    back = decode_advert(a.encode())  # an 8-GPU node with 4 models fits the 8 KiB advert
    assert back == a and back.models[0].kv_bytes_per_token == 327_680
    assert Hardware.from_dict(back.hardware) == hw
    assert read_signals(back.hardware).free_memory_bytes == 70 << 30
    old = make()  # what a node of before live readings sends: no kvb, no live figures
    body = old.to_dict()
    assert "kvb" not in body["models"][0] and "power_w" not in body["hw"]
    back = decode_advert(pack(body))
    assert back.models[0].kv_bytes_per_token == 0
    assert read_signals(back.hardware).free_memory_bytes is None


def test_batch_capacity_and_curve_travel_and_older_adverts_read_as_unbatched() -> None:
    m = ModelAdvert("tiny", 6, 0, 6, 500.0, 40.0, 1000, 192, batch_max=8,
                    batch_tps=(40.0, 78.5, 150.0, 0.0))
    a = make(models=(m,))
    back = decode_advert(a.encode())
    assert back.models[0].batch_max == 8 and back.models[0].batch_tps == (40.0, 78.5, 150.0, 0.0)
    d = a.to_dict()
    del d["models"][0]["batch"], d["models"][0]["batch_tps"]  # an advert from before the fields
    old = decode_advert(pack(d)).models[0]
    assert old.batch_max == 0 and old.batch_tps == ()
    assert "batch" not in make().to_dict()["models"][0]  # not batched: nothing on the wire
    for bad in ([1.0] * 13, [-1.0], [float("inf")], ["x"]):
        d = a.to_dict()
        d["models"][0]["batch_tps"] = bad
        with pytest.raises(ProtocolError, match="batch_tps"):
            decode_advert(pack(d))


def test_prefix_sketch_travels_bounded_and_the_older_list_is_read_and_ignored() -> None:
    from meshd.core.prefix_names import SKETCH_MAX_BYTES

    sk = bytes(range(256)) * 2  # a full sketch: 512 bytes
    a = make(models=(ModelAdvert("tiny", 6, 0, 6, 500.0, 40.0, 1000, 192, prefix_sketch=sk),))
    assert decode_advert(a.encode()).models[0].prefix_sketch == sk
    # the sketch's bound on the wire: 512 bytes are 519 bytes of msgpack with the key
    assert len(a.encode()) - len(make().encode()) <= SKETCH_MAX_BYTES + 7
    assert "pxs" not in make().to_dict()["models"][0]  # none held: nothing on the wire
    for bad in (b"x" * 7, b"x" * 24, b"x" * 1024, "text8chr", [b"x" * 8]):
        d = a.to_dict()
        d["models"][0]["pxs"] = bad
        with pytest.raises(ProtocolError, match="'pxs'"):
            decode_advert(pack(d))
    d = make().to_dict()  # a node of before the sketch: its list of 8-byte names is ignored
    d["models"][0]["px"] = [b"n" * 8] * 16
    assert decode_advert(pack(d)).models[0].prefix_sketch == b""
    for bad in ([b"x" * 8] * 17, [b"short"], ["text8chr"], [1]):
        d["models"][0]["px"] = bad
        with pytest.raises(ProtocolError, match="'px'"):
            decode_advert(pack(d))
