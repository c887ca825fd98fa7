"""The store's schema and its migrations.

``schema_version`` holds one row per migration applied. A migration is ``(version, function)``;
``migrate`` applies, in order and each in its own transaction, those above the database's
version. To change the schema, append a migration (never edit one that has shipped). A
database written by a newer meshd (a version above every migration known here) is refused
rather than guessed at.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sqlite_utils import Database

from meshd.store.rows import StoreError

Migration = tuple[int, Callable[[Database], None]]


def _v1(db: Database) -> None:
    db.table("journal").create(
        {
            "id": int,
            "ts": float,
            "request_id": str,
            "kind": str,
            "node": str,
            "payload": str,
        },
        pk="id",
        not_null={"ts", "request_id", "kind"},
    )
    db.table("journal").create_index(["request_id", "id"])
    db.table("journal").create_index(["ts"])
    db.table("decisions").create(
        {
            "request_id": str,
            "ts": float,
            "strategy": str,
            "candidates": str,
            "constraints": str,
            "chosen": str,
            "order": str,
            "plan": str,
        },
        pk="request_id",
        not_null={"ts"},
    )
    db.table("decisions").create_index(["ts"])
    db.table("outcomes").create(
        {
            "request_id": str,
            "ts": float,
            "ttft_ms": float,
            "tokens": int,
            "tokens_per_s": float,
            "served_by": str,
            "route": str,
            "error": str,
            "retries": int,
            "hedges": int,
        },
        pk="request_id",
        not_null={"ts"},
    )
    db.table("outcomes").create_index(["ts"])
    db.table("audit").create(
        {"id": int, "ts": float, "kind": str, "peer_id": str, "reason": str, "detail": str},
        pk="id",
        not_null={"ts", "kind"},
    )
    db.table("audit").create_index(["ts"])
    db.table("audit").create_index(["kind"])


MIGRATIONS: tuple[Migration, ...] = ((1, _v1),)
SCHEMA_VERSION = MIGRATIONS[-1][0]


def current_version(db: Database) -> int:
    if "schema_version" not in db.table_names():
        return 0
    row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(db: Database, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring ``db`` up to the last of ``migrations``; returns the version it is at."""
    versions = [v for v, _ in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise StoreError(f"migrations must be numbered 1, 2, 3...; got {versions}")
    with db.atomic():
        db.table("schema_version").create(
            {"version": int, "applied_ts": float}, pk="version", if_not_exists=True
        )
    have = current_version(db)
    if have > len(versions):
        raise StoreError(
            f"the database has schema version {have}, newer than this meshd knows "
            f"({len(versions)}); upgrade meshd or move the database aside"
        )
    for version, apply in migrations[have:]:
        with db.atomic():
            apply(db)
            db.table("schema_version").insert({"version": version, "applied_ts": time.time()})
    return len(versions)
