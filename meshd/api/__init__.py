"""The OpenAI-compatible HTTP API and Prometheus metrics of every daemon (docs/api.md).

A small ASGI app (``app.py``) served with h11 on trio (``h11server.py``, ``server.py``). The pieces that
decide things are plain functions without I/O: the OpenAI request shapes to SUBMIT fields
(``shapes.py``), the OpenAI response objects (``replies.py``), error codes to HTTP statuses
(``errors.py``), API keys (``auth.py``). Every request goes through the node's entry chain
(``protocols.EntryChain``), exactly as `meshd submit` does.
"""
