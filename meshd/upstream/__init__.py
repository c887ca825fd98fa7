"""Models served by forwarding to OpenAI-compatible servers (docs/upstream.md)."""
