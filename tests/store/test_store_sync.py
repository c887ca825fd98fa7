"""Store on a real SQLite file: schema, records, explain, reads, migrations, failures."""

from __future__ import annotations

import sqlite3

import pytest
from store_samples import decision, outcome

from meshd.store import MIGRATIONS, SCHEMA_VERSION, Store, StoreError
from meshd.store.rows import Row


def columns(path, table):
    with sqlite3.connect(path) as conn:
        return [r[1] for r in conn.execute(f"PRAGMA table_info([{table}])")]


def test_schema_and_wal(store):
    assert store.schema_version == SCHEMA_VERSION == 1
    assert store.db.journal_mode == "wal"
    assert columns(store.path, "journal") == ["id", "ts", "request_id", "kind", "node", "payload"]
    assert columns(store.path, "decisions") == [
        "request_id",
        "ts",
        "strategy",
        "candidates",
        "constraints",
        "chosen",
        "order",
        "plan",
    ]
    assert columns(store.path, "outcomes") == [
        "request_id",
        "ts",
        "ttft_ms",
        "tokens",
        "tokens_per_s",
        "served_by",
        "route",
        "error",
        "retries",
        "hedges",
    ]
    assert columns(store.path, "audit") == ["id", "ts", "kind", "peer_id", "reason", "detail"]


def test_explain_joins_decision_outcome_and_events(store):
    store.record_event("r1", "received", node="gw-1", ts=10.0)
    store.record_decision("r1", **decision(), ts=10.001)
    store.record_event("r1", "routed", node="gw-1", payload={"to": "P2"}, ts=10.002)
    store.record_event("r1", "first_token", node="gw-1", ts=10.05)
    store.record_outcome("r1", **outcome(retries=1), ts=10.5)
    r = store.explain("r1")
    assert r["request_id"] == "r1"
    assert r["decision"]["strategy"] == "meshd"
    assert r["decision"]["candidates"][0]["name"] == "gw-2"
    assert r["decision"]["candidates"][2]["predicted_ttft_ms"] is None  # inf: strict JSON
    assert r["decision"]["order"] == ["P2", "P1"] and r["decision"]["plan"] is None
    assert r["decision"]["constraints"] == {"residency": "eu"}
    assert r["outcome"]["route"] == ["gw-2"] and r["outcome"]["ttft_ms"] == 52.0
    assert [e["kind"] for e in r["events"]] == ["received", "routed", "first_token"]
    assert r["events"][1]["payload"] == {"to": "P2"}
    assert (r["retries"], r["hedges"]) == (1, 0)


def test_explain_unknown_and_partial(store):
    assert store.explain("nope") is None
    store.record_event("r2", "received", ts=1.0)
    store.record_event("r2", "retry", ts=2.0)
    store.record_event("r2", "hedge", ts=3.0)
    store.record_event("r2", "retry", ts=4.0)
    r = store.explain("r2")
    assert r["decision"] is None and r["outcome"] is None
    assert (r["retries"], r["hedges"]) == (2, 1)


def test_a_replan_replaces_the_decision(store):
    store.record_decision("r1", **decision(), ts=1.0)
    plan = {"hops": [{"name": "gw-1", "layer_start": 0, "layer_end": 12, "predicted_ms": 30.0}]}
    store.record_decision("r1", **decision(chosen=None, plan=plan), ts=2.0)
    d = store.explain("r1")["decision"]
    assert d["plan"] == plan and d["chosen"] is None and d["ts"] == 2.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.record_event("r", "exploded"), "unknown request event kind"),
        (lambda s: s.record_event("", "received"), "request_id"),
        (lambda s: s.record_outcome(None, **outcome()), "request_id"),
        (lambda s: s.record_audit("", peer_id="p", reason="x"), "audit kind"),
    ],
)
def test_misuse_is_a_local_error(store, call, message):
    with pytest.raises(StoreError, match=message):
        call(store)


def test_odd_values_become_plain_json(store):
    store.record_event(
        "r",
        "failed",
        payload={"nan": float("nan"), "set": {3, 1}, "bytes": b"\x01\xff", "tuple": (1, 2), 5: 6},
    )
    payload = store.explain("r")["events"][0]["payload"]
    assert payload == {"nan": None, "set": [1, 3], "bytes": "01ff", "tuple": [1, 2], "5": 6}


def test_recent_requests(store):
    store.record_event("a", "received", ts=1.0)
    store.record_outcome("a", **outcome(), ts=1.5)
    store.record_event("b", "received", ts=2.0)
    store.record_decision("b", **decision(), ts=2.1)
    store.record_outcome("b", **outcome(error="no route", served_by=None, route=[]), ts=2.2)
    store.record_event("c", "received", ts=3.0)
    got = store.recent_requests(10)
    assert [(r["request_id"], r["status"]) for r in got] == [
        ("c", "pending"),
        ("b", "failed"),
        ("a", "done"),
    ]
    assert got[1]["strategy"] == "meshd" and got[1]["chosen"] == "P2"
    assert [r["request_id"] for r in store.recent_requests(2)] == ["c", "b"]
    assert store.recent_requests(0) == []


def test_audit(store):
    store.record_audit("attestation_failed", peer_id="QmA", reason="expired", ts=1.0)
    store.record_audit(
        "attestation_failed", peer_id="QmB", reason="wrong CA", ts=2.0, detail={"serial": 7}
    )
    store.record_audit("advert_rejected", peer_id="QmA", reason="replayed seq", ts=3.0)
    assert store.audit_counts() == {"advert_rejected": 1, "attestation_failed": 2}
    assert store.audit_counts(since_ts=2.0) == {"advert_rejected": 1, "attestation_failed": 1}
    latest = store.recent_audit(2)
    assert [a["reason"] for a in latest] == ["replayed seq", "wrong CA"]
    assert latest[1]["detail"] == {"serial": 7}


def test_prune(store):
    store.record_event("old", "received", ts=1.0)
    store.record_decision("old", **decision(), ts=1.0)
    store.record_outcome("old", **outcome(), ts=1.0)
    store.record_audit("revoked", peer_id="p", reason="serial 3", ts=1.0)
    store.record_event("new", "received", ts=5.0)
    assert store.prune(before_ts=2.0) == 4
    assert store.explain("old") is None and store.explain("new") is not None


def test_reopen_keeps_data_and_does_not_migrate_twice(tmp_path):
    path = tmp_path / "meshd.db"
    first = Store(path)
    first.record_event("r", "received")
    first.close()
    again = Store(path)
    try:
        assert again.explain("r") is not None
        assert again.db.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 1
    finally:
        again.close()


def _v2(db):
    db["outcomes"].add_column("model", str)


def test_migration_hook_and_newer_schema_refused(tmp_path):
    path = tmp_path / "meshd.db"
    Store(path).close()
    upgraded = Store(path, migrations=(*MIGRATIONS, (2, _v2)))
    assert upgraded.schema_version == 2
    upgraded.close()
    assert "model" in columns(path, "outcomes")
    with pytest.raises(StoreError, match="schema version 2, newer"):
        Store(path)


def test_failed_migration_rolls_back(tmp_path):
    path = tmp_path / "meshd.db"

    def broken(db):
        db["scratch"].create({"x": int})
        raise sqlite3.OperationalError("boom")

    with pytest.raises(StoreError, match="boom"):
        Store(path, migrations=(*MIGRATIONS, (2, broken)))
    store = Store(path)
    try:
        assert store.schema_version == 1 and "scratch" not in store.db.table_names()
    finally:
        store.close()


def test_migrations_must_be_numbered(tmp_path):
    with pytest.raises(StoreError, match="numbered"):
        Store(tmp_path / "x.db", migrations=((2, _v2),))


def test_unusable_paths(tmp_path):
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreError, match="dir.db"):
        Store(tmp_path / "dir.db")
    (tmp_path / "junk.db").write_bytes(b"not a database at all, just junk" * 64)
    with pytest.raises(StoreError, match="junk.db"):
        Store(tmp_path / "junk.db")


def test_a_bad_row_fails_alone(store):
    good = Row(
        "journal", {"ts": 1.0, "request_id": "r", "kind": "received", "node": "", "payload": "{}"}
    )
    bad = Row(
        "journal", {"ts": None, "request_id": "r", "kind": "done", "node": "", "payload": "{}"}
    )
    results = store.write([good, bad, good])
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], sqlite3.IntegrityError)
    assert [e["kind"] for e in store.explain("r")["events"]] == ["received", "received"]


def test_readers_see_committed_rows_from_another_connection(store):
    store.record_event("r", "received")
    with sqlite3.connect(store.path) as other:
        assert other.execute("SELECT kind FROM journal").fetchall() == [("received",)]


def test_memory_store():
    s = Store(":memory:")
    s.record_event("r", "received")
    assert s.explain("r")["events"][0]["kind"] == "received"
    s.close()
