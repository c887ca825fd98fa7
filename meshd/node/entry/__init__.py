"""The entry node's side of a request, as one ordered chain of steps (``chain.STEPS``)."""

from meshd.node.entry.chain import STEPS, EntryChain

__all__ = ["STEPS", "EntryChain"]
