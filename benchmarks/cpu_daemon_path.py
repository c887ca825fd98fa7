"""CPU time of the daemon's per-request routing work (bench_router.daemon_path) at 1,000 peers,
for the tree on PYTHONPATH: process CPU seconds for 40 requests (steady case), which contention
from other processes inflates far less than wall-clock time. Run it alternately on two commits
(issue 12's side-by-side check):

    PYTHONPATH=/path/to/tree .venv/bin/python benchmarks/cpu_daemon_path.py
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.environ.get("PYTHONPATH", "."), "benchmarks"))
import bench_router as b  # noqa: E402

b.daemon_path(1000, 3)  # imports and first-advert work out of the way
t, w = time.process_time(), time.perf_counter()
d = b.daemon_path(1000, 40)
print(os.environ.get("PYTHONPATH", "."), f"cpu_s={time.process_time() - t:.3f} wall_s={time.perf_counter() - w:.3f}",
      {k: round(v, 2) for k, v in d.items()})
