"""Ollama's API on the API's listener (docs/ollama.md): ``shapes`` (requests to SUBMIT fields)
and ``replies`` (answers) are pure; ``handlers`` are the thin endpoints, added to the app's routes
by ``meshd.api.server.build_app``."""
