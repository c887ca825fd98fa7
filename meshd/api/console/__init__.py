"""The web console: every node serves it on its API listener at ``/ui`` (docs/console.md).

``app.ConsoleApp`` answers ``/ui``: the page (``static/``: plain HTML, CSS and ES modules shipped
as package data, no build step, nothing fetched from elsewhere) and its read-only JSON and
event-stream endpoints under ``/ui/api``. What it shows is worked out by pure functions: the map
(``atlas``), the list of requests (``requests``), the metrics and configuration in words
(``words``). What it reads of the node is the narrow ``source.ConsoleSource``.
"""

from meshd.api.console.app import PREFIX, ConsoleApp
from meshd.api.console.source import ConsoleSource, MeshRows

__all__ = ["PREFIX", "ConsoleApp", "ConsoleSource", "MeshRows"]
