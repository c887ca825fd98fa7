"""Dev script for a machine with an NVIDIA GPU: run meshd's NVML path for real and record it.

    python3 scripts/gpu_check.py OUT_DIR [--burn-s 20]

1. onnxruntime's providers and what ``meshd.engine.choose_providers`` picks.
2. ``HostTelemetry().read()`` (real pynvml) once a second: idle, while a GPU load runs (a
   matrix-product loop in a child process, through PyTorch when the machine has it: only this
   script uses it, meshd never imports torch), and after.
3. A real 2-daemon testnet (``meshd testnet up --nodes 2 --advert-interval 1``): node 2's
   ``meshd peers --json`` view of node 1's GPU reading (``hardware.gpus`` and ``signals``) while
   idle and while the GPU is loaded, node 1's ``status --json`` telemetry service, one submit.
4. Loading the shipped model with the CUDA provider (what ``[engine] providers = "cuda"`` asks):
   what the engine says when onnxruntime has no CUDA provider.

Writes ``OUT_DIR/gpu_check.json`` (every reading) and prints a summary. Each step is
independent: a failing step is recorded and the next one runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BURN = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
hold = torch.empty(int(20e9) // 2, dtype=torch.bfloat16, device="cuda")  # 20 GB held: memory moves too
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
"""


def under_load(burn_s: float, every_s: float, sample: Callable[[], None]) -> None:
    """Run the GPU load for ``burn_s`` seconds, calling ``sample`` every ``every_s`` meanwhile."""
    burner = subprocess.Popen([sys.executable, "-c", BURN, str(burn_s)])
    t_end = time.monotonic() + burn_s
    while time.monotonic() < t_end and burner.poll() is None:
        time.sleep(every_s)
        sample()
    burner.wait()


def gpu_view(hw: Any) -> list[dict[str, Any]]:
    return [dict(g) if isinstance(g, dict) else {k: getattr(g, k) for k in g.__dataclass_fields__}
            for g in (hw.get("gpus", []) if isinstance(hw, dict) else hw.gpus)]


def step_providers(rec: dict[str, Any]) -> None:
    import onnxruntime as ort

    from meshd.engine import choose_providers
    rec["onnxruntime"] = {"version": ort.__version__, "available": ort.get_available_providers(),
                          "meshd_auto_choice": choose_providers(None)}


def step_nvml(rec: dict[str, Any], burn_s: float) -> None:
    from meshd.telemetry import HostTelemetry

    src = HostTelemetry()
    rows: list[dict[str, Any]] = []

    def sample(phase: str) -> None:
        t = time.monotonic()
        hw = src.read()
        rows.append({"phase": phase, "read_ms": round((time.monotonic() - t) * 1000, 3),
                     "kind": hw.kind, "stale": list(hw.stale), "gpus": gpu_view(hw)})

    for _ in range(3):
        sample("idle")
        time.sleep(1)
    under_load(burn_s, 1.0, lambda: sample("load"))
    for _ in range(3):
        time.sleep(1)
        sample("after")
    src.close()
    rec["nvml_readings"] = rows


def meshd(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshd", *args], capture_output=True, text=True,
                          timeout=timeout, check=check)


def step_testnet(rec: dict[str, Any], burn_s: float) -> None:
    d = "/tmp/gpu-testnet"
    up = meshd("testnet", "up", "--nodes", "2", "--dir", d, "--advert-interval", "1", timeout=300)
    rec["testnet_up"] = up.stdout[-2000:]
    index = json.loads(Path(d, "testnet.json").read_text())
    socks = [n["socket"] for n in index["nodes"]]
    names = [n["name"] for n in index["nodes"]]
    views: list[dict[str, Any]] = []

    def view(phase: str) -> None:
        peers = json.loads(meshd("peers", "--json", "--socket", socks[1]).stdout)
        rows = peers if isinstance(peers, list) else peers.get("peers", peers)
        for p in rows:
            if p.get("name") == names[0]:
                views.append({"phase": phase, "t": round(time.time(), 1),
                              "gpus": (p.get("hardware") or {}).get("gpus"),
                              "kind": (p.get("hardware") or {}).get("kind"),
                              "kv_memory": (p.get("hardware") or {}).get("kv_memory"),
                              "signals": p.get("signals"), "advert_age_s": p.get("advert_age_s")})

    try:
        view("idle")
        under_load(burn_s, 2.0, lambda: view("load"))
        time.sleep(3)
        view("after")
        st = json.loads(meshd("status", "--json", "--socket", socks[0]).stdout)
        rec["status_node1_telemetry"] = (st.get("services") or {}).get("telemetry", st.get("telemetry"))
        rec["status_node1_hardware"] = st.get("hardware")
        sub = meshd("submit", "--json", "--socket", socks[1], "hello from the GPU box", check=False)
        rec["submit"] = {"rc": sub.returncode, "out": sub.stdout[-1500:], "err": sub.stderr[-800:]}
    finally:
        rec["peer_views"] = views
        down = meshd("testnet", "down", "--dir", d, check=False)
        rec["testnet_down_rc"] = down.returncode


def step_cuda_config(rec: dict[str, Any]) -> None:
    """What a node configured with ``[engine] providers = "cuda"`` gets from the engine."""
    from meshd.engine import default_model_path, load_model
    try:
        m = load_model(default_model_path(), providers=["CUDAExecutionProvider"])
        rec["cuda_load"] = {"provider": m.provider}
    except Exception as err:  # recorded: what a user sees
        rec["cuda_load"] = {"error": f"{type(err).__name__}: {err}"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--burn-s", type=float, default=20.0)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True)
        rec["nvidia_smi"] = smi.stdout.strip()
    except OSError as err:
        rec["nvidia_smi"] = f"not run: {err}"
    for name, fn in (("providers", lambda: step_providers(rec)), ("nvml", lambda: step_nvml(rec, args.burn_s)),
                     ("testnet", lambda: step_testnet(rec, args.burn_s)), ("cuda_config", lambda: step_cuda_config(rec))):
        t = time.monotonic()
        try:
            fn()
            rec.setdefault("steps", {})[name] = f"ok {time.monotonic() - t:.1f}s"
        except Exception as err:
            rec.setdefault("steps", {})[name] = f"FAILED {type(err).__name__}: {err}"[:2000]
        print(name, rec["steps"][name], flush=True)
        (out / "gpu_check.json").write_text(json.dumps(rec, indent=1, default=str))
    print(json.dumps({k: rec.get(k) for k in ("nvidia_smi", "onnxruntime", "steps")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
