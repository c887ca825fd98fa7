"""The entry node's side of a request, as one ordered chain of steps (``chain.STEPS``)."""

from meshd.node.entry.chain import STEPS, EntryChain
from meshd.node.entry.context import EntryState

__all__ = ["STEPS", "EntryChain", "EntryState"]
