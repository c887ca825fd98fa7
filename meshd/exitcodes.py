"""Exit codes of every meshd command, shared with systemd/meshd.service.

They follow sysexits.h so that systemd's ``RestartPreventExitStatus=`` can tell a fault that a
restart will not fix (bad config, unsafe key permissions) from one it may (lost network).
"""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    OK = 0
    FAILURE = 1  # the command ran and failed (a request failed, a test node did not answer)
    USAGE = 2  # bad command line (argparse's own code)
    UNAVAILABLE = 69  # EX_UNAVAILABLE: no daemon to talk to, no route, peer gone
    SOFTWARE = 70  # EX_SOFTWARE: a bug in meshd; please report it
    TEMPFAIL = 75  # EX_TEMPFAIL: try again later (busy, network down at start)
    NOPERM = 77  # EX_NOPERM: key file readable by others, attestation refused
    CONFIG = 78  # EX_CONFIG: bad config file or key name
    INTERRUPTED = 130  # SIGINT
