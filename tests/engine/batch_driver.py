"""Drive a ``BatchScheduler`` with sequences joining at given steps (tests of batching)."""

from __future__ import annotations

from meshd.engine.scheduler import BatchScheduler, BatchSequence


def run_with_joins(sched: BatchScheduler, seqs: list[BatchSequence],
                   join_at: dict[int, list[int]], max_steps: int = 200) -> list[list[int]]:
    """Step ``sched`` until idle, adding ``seqs[i]`` at step ``s`` for each ``i`` in
    ``join_at[s]``; returns each sequence's token ids in order."""
    got: list[list[int]] = [[] for _ in seqs]
    step = 0
    while step < max_steps and (step <= max(join_at) or sched.busy):
        for i in join_at.get(step, []):
            sched.add(seqs[i])
        for s in sched.step():
            got[seqs.index(s)] += [e.token_id for e in s.events]
            s.events.clear()
        step += 1
    return got
