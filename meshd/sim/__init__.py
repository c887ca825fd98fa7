"""``meshd sim``: a discrete-event simulator of a whole mesh (docs/sim.md).

Modules, in the order a request meets them: ``scenario`` holds a scenario, which
``scenario_parse`` (with ``toml_table``) reads from a file; ``world`` builds the nodes, cells and
``latency`` model; ``workload`` draws arrivals; ``loop`` runs the event loop (``events``: the
event kinds, and the view of the run that ``admission``, ``hedging`` and ``pipeline`` handle
events with); ``views`` builds each entry node's ``MeshSnapshot`` for the daemon's router
(``meshd.core.routing``) and planner (``meshd.core.planner``, via ``pipeline``); ``hedging``
sends hedge copies; ``metrics`` and ``report`` summarise; ``runner`` and ``progress`` drive it
from ``meshd.cli.sim``.
``meshd.testnet.to_sim`` derives a scenario for one fixed route of an emulated testnet (the validation
test, tests/testnet/test_sim_validation.py).
"""
