"""meshd: a peer-to-peer edge inference mesh."""

__version__ = "0.1.0"
