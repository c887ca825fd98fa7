"""Retrieval-augmented generation at the edge: collections of chunked, embedded documents in
SQLite with a vector index (``RagStore``), and the pure chunker (``chunking``). docs/rag.md."""
