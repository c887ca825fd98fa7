"""``Store``: the node's SQLite record of requests, routing decisions and security events.

Synchronous and thread-safe (one lock around the one connection), so it may be called from
any thread, one at a time; in the daemon every call goes through ``AsyncStore``, which keeps
the trio thread free and is the single writer. The database runs in WAL mode with
``synchronous=NORMAL``: a crash of meshd loses nothing committed, a power cut at worst the
last few transactions.

Tables (JSON columns hold text): ``journal`` (request lifecycle events), ``decisions`` (one
per request: the routing choice and its inputs), ``outcomes`` (one per request: what
happened), ``audit`` (security events), ``schema_version``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from meshd.store.protocol import Recorder
from meshd.store.rows import Row, StoreError, from_json
from meshd.store.schema import MIGRATIONS, Migration, migrate

log = logging.getLogger(__name__)

_DECISION_COLS = ("ts", "strategy", "candidates", "constraints", "chosen", "order", "plan")
_OUTCOME_COLS = (
    "ts", "ttft_ms", "tokens", "tokens_per_s", "served_by", "route", "error", "retries", "hedges"
)  # fmt: skip


class Store(Recorder):
    """Open (creating if needed) the store at ``path`` (``":memory:"`` for a throwaway one)
    and migrate it. ``migrations`` is the migration hook (tests pass extra ones).

    Raises ``StoreError`` with one line naming the path when the file cannot be used.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, migrations: Sequence[Migration] = MIGRATIONS
    ) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0)
        except (OSError, sqlite3.Error) as err:
            raise StoreError(f"cannot open the store {self.path}: {err}") from None
        try:
            self.db = Database(conn, execute_plugins=False)
            if self.path != ":memory:":
                self.db.enable_wal()
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.schema_version = migrate(self.db, migrations)
        except sqlite3.Error as err:
            conn.close()
            raise StoreError(f"cannot use the store {self.path}: {err}") from None
        except StoreError:
            conn.close()
            raise

    # -- writes ---------------------------------------------------------------------------

    def write(self, batch: Sequence[Row]) -> list[BaseException | None]:
        """Write ``batch`` in one transaction, each row under its own savepoint: a row that
        fails (disk full, a constraint) is rolled back alone and its error returned in its
        place; the others are committed."""
        results: list[BaseException | None] = []
        with self._lock, self.db.atomic():
            for row in batch:
                try:
                    with self.db.atomic():
                        self.db.table(row.table).insert(row.values, replace=row.replace)
                    results.append(None)
                except Exception as err:  # lose this row, not the batch
                    log.warning("store write failed table=%s error=%r", row.table, err)
                    results.append(err)
        return results

    def _put(self, row: Row) -> None:
        (err,) = self.write([row])
        if err is not None:
            raise StoreError(f"cannot write to the store {self.path}: {err}")

    def prune(self, before_ts: float) -> int:
        """Delete every row older than ``before_ts``; returns how many went."""
        with self._lock, self.db.atomic():
            return sum(
                self.db.execute(f"DELETE FROM [{t}] WHERE ts < ?", [before_ts]).rowcount
                for t in ("journal", "decisions", "outcomes", "audit")
            )

    # -- reads ----------------------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.db.query(sql, params))

    def explain(self, request_id: str) -> dict[str, Any] | None:
        """Everything known about one request, or ``None`` if nothing is::

            {"request_id", "decision": {ts, strategy, candidates, constraints, chosen,
             order, plan} | None, "outcome": {ts, ttft_ms, tokens, tokens_per_s, served_by,
             route, error, retries, hedges} | None, "events": [{id, ts, kind, node,
             payload}], "retries", "hedges", "tier": {...} | None}

        ``retries``/``hedges`` come from the outcome, else from counting events; ``tier`` is
        the payload of the request's "tier" event (model = "auto": docs/tiers.md), if any.
        """
        cols = ", ".join(f'"{c}"' for c in _DECISION_COLS)
        found = self._query(f"SELECT {cols} FROM decisions WHERE request_id = ?", [request_id])
        decision = found[0] if found else None
        if decision is not None:
            for key in ("candidates", "constraints", "order", "plan"):
                decision[key] = from_json(decision[key])
        cols = ", ".join(_OUTCOME_COLS)
        found = self._query(f"SELECT {cols} FROM outcomes WHERE request_id = ?", [request_id])
        outcome = found[0] if found else None
        if outcome is not None:
            outcome["route"] = from_json(outcome["route"])
        events = self._query(
            "SELECT id, ts, kind, node, payload FROM journal WHERE request_id = ? ORDER BY id",
            [request_id],
        )
        for event in events:
            event["payload"] = from_json(event["payload"])
        if decision is None and outcome is None and not events:
            return None
        kinds = [e["kind"] for e in events]
        return {
            "request_id": request_id,
            "decision": decision,
            "outcome": outcome,
            "events": events,
            "retries": outcome["retries"] if outcome else kinds.count("retry"),
            "hedges": outcome["hedges"] if outcome else kinds.count("hedge"),
            "tier": next((e["payload"] for e in events if e["kind"] == "tier"), None),
        }

    def recent_requests(self, n: int = 20) -> list[dict[str, Any]]:
        """The ``n`` requests first seen most recently, newest first, one summary each:
        request_id, ts, strategy, chosen, served_by, ttft_ms, tokens, tokens_per_s, error,
        retries, hedges, status (``done``, ``failed`` or ``pending``: no outcome yet)."""
        found = self._query(
            """
            WITH seen AS (
                SELECT request_id, MIN(ts) AS ts FROM (
                    SELECT request_id, ts FROM journal
                    UNION ALL SELECT request_id, ts FROM decisions
                    UNION ALL SELECT request_id, ts FROM outcomes
                ) GROUP BY request_id
                ORDER BY ts DESC, request_id DESC LIMIT ?
            )
            SELECT s.request_id, s.ts, d.strategy, d.chosen, o.served_by, o.ttft_ms, o.tokens,
                   o.tokens_per_s, o.error, o.retries, o.hedges, o.request_id IS NOT NULL AS ended
            FROM seen s
            LEFT JOIN decisions d ON d.request_id = s.request_id
            LEFT JOIN outcomes o ON o.request_id = s.request_id
            ORDER BY s.ts DESC, s.request_id DESC
            """,
            [max(0, int(n))],
        )
        for r in found:
            ended = r.pop("ended")
            r["status"] = ("failed" if r["error"] else "done") if ended else "pending"
        return found

    def audit_counts(self, since_ts: float | None = None) -> dict[str, int]:
        """How many audit events of each kind (since ``since_ts`` if given)."""
        found = self._query(
            "SELECT kind, COUNT(*) AS n FROM audit WHERE ts >= ? GROUP BY kind ORDER BY kind",
            [float("-inf") if since_ts is None else since_ts],
        )
        return {r["kind"]: r["n"] for r in found}

    def recent_audit(self, n: int = 20, kind: str | None = None) -> list[dict[str, Any]]:
        """The ``n`` latest audit events (of ``kind`` only, if given), newest first."""
        where, params = ("WHERE kind = ?", [kind]) if kind else ("", [])
        found = self._query(
            f"SELECT id, ts, kind, peer_id, reason, detail FROM audit {where} "
            "ORDER BY id DESC LIMIT ?",
            [*params, max(0, int(n))],
        )
        for r in found:
            r["detail"] = from_json(r["detail"])
        return found

    def close(self) -> None:
        with self._lock:
            self.db.close()
