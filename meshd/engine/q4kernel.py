"""meshd's 4-bit product (``kernels/matmul_q4.c``, an onnxruntime custom operator), built on
the machine that runs it.

A 4-bit block with a minimum (GGUF's Q4_1, Q4_K re-blocked to 32) is read by it as the 16 code
bytes meshd stores plus a float16 scale and minimum: 20 bytes, as llama.cpp reads Q4_1, where
onnxruntime's MatMulNBits repacks it to 24 and needs the minimums as a second product (a Gemm
over the activations' block sums, with its Reshape and ReduceSum). On a SmolLM2-135M decode
step that is about a fifth of the time (docs/engine.md, "The 4-bit kernel").

The library is compiled once per source, compiler and machine into meshd's cache folder
(``$MESHD_CACHE_DIR``, else ``~/.cache/meshd``) with ``-O3 -march=native``; it needs a C compiler
(``$CC``, else ``cc``) and onnxruntime's C API header, which onnxruntime's wheel does not ship:
``$MESHD_ORT_INCLUDE``, else the environment's ``include/onnxruntime`` (where
``scripts/ort_header.sh`` puts it), else ``/usr/include/onnxruntime`` or
``/usr/local/include/onnxruntime`` (Debian's and Ubuntu's ``libonnxruntime-dev``). Where either
is missing, where the CPU has none of its vector paths (AVX2, AVX-VNNI, AVX-512 VNNI: on an
ARM board onnxruntime's own NEON kernels should be faster; not measured), or with ``MESHD_Q4_KERNEL=0``,
the graph keeps MatMulNBits and its second product: the same model, slower on x86;
``status()`` says why, and the engine logs it once (a warning, but where switched off).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from meshd.paths import cache_home

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels") / "matmul_q4.c"
HEADER = "onnxruntime_c_api.h"
# the operator's domain and name in a stage graph (kernels/matmul_q4.c registers them)
DOMAIN, OP = "meshd", "MatMulQ4"
BLOCK = 32
_FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c11")


@dataclass(frozen=True)
class KernelStatus:
    library: Path | None  # the built library, or None
    reason: str  # why there is none, or the vector path built ("avx512vnni", "avx2", "c")

    @property
    def label(self) -> str:
        """What a benchmark records: the vector path, or "none: " and why."""
        return self.reason if self.library else f"none: {self.reason}"


def header_dirs() -> list[Path]:
    """Where onnxruntime's C API header is looked for, in order."""
    env = os.environ.get("MESHD_ORT_INCLUDE")
    dirs = [Path(env)] if env else []
    return dirs + [Path(sys.prefix) / "include" / "onnxruntime",
                   Path("/usr/include/onnxruntime"), Path("/usr/local/include/onnxruntime")]


def _find_header() -> Path | None:
    for d in header_dirs():
        if (d / HEADER).is_file():
            return d
    return None


def _compiler() -> str | None:
    cc = os.environ.get("CC", "cc")
    return shutil.which(cc)


def _key(cc: str, include: Path) -> str:
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    h.update((include / HEADER).read_bytes())
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    h.update(version.stdout.encode())
    h.update(" ".join(_FLAGS).encode())
    # -march=native: the library is this CPU's; a cache folder shared between machines must
    # not hand one CPU's build to another
    try:
        cpu = Path("/proc/cpuinfo").read_text(errors="replace")
        h.update("\n".join(ln for ln in cpu.splitlines()
                           if ln.startswith(("flags", "Features", "model name"))).encode())
    except OSError:
        pass
    return h.hexdigest()[:16]


def _build(cc: str, include: Path, out: Path) -> str | None:
    """Compile into ``out`` (atomically: a half-written library is never left there); the
    compiler's first error line, or None."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        run = subprocess.run([cc, *_FLAGS, f"-I{include}", str(SOURCE), "-o", tmp, "-lm"],
                             capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            lines = [ln for ln in (run.stderr or run.stdout).splitlines() if "error" in ln]
            return (lines or (run.stderr or "").splitlines() or ["no output"])[0].strip()
        os.replace(tmp, out)
        return None
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _vector_path(lib: Path) -> str:
    import ctypes

    fn = ctypes.CDLL(str(lib)).meshd_q4_path
    fn.restype = ctypes.c_char_p
    return str(fn().decode())


@functools.cache
def status() -> KernelStatus:
    """The kernel library for this machine, built if needed (once a process)."""
    if os.environ.get("MESHD_Q4_KERNEL", "1") == "0":
        return KernelStatus(None, "MESHD_Q4_KERNEL=0")
    include = _find_header()
    if include is None:
        return KernelStatus(None, f"no onnxruntime C API header ({HEADER}) in "
                                  + ", ".join(str(d) for d in header_dirs())
                                  + " (scripts/ort_header.sh fetches one)")
    api = header_api_version(include)
    if api is None:
        return KernelStatus(None, f"{include / HEADER} names no C API version (ORT_API_VERSION)")
    if api > _runtime_api_version():
        return KernelStatus(None, f"{include / HEADER} is for onnxruntime's C API version {api}, "
                                  f"newer than this onnxruntime's ({ort_version()})")
    cc = _compiler()
    if cc is None:
        return KernelStatus(None, f"no C compiler ({os.environ.get('CC', 'cc')})")
    try:
        lib = cache_home() / "kernels" / f"matmul_q4-{_key(cc, include)}.so"
        for attempt in (1, 2):
            if not lib.is_file():
                err = _build(cc, include, lib)
                if err is not None:
                    return KernelStatus(None, f"the build failed: {err}")
                log.info("q4 kernel built path=%s", lib)
            try:
                path = _vector_path(lib)
            except OSError:  # a damaged file in the cache: built again, once
                if attempt == 2:
                    raise
                lib.unlink(missing_ok=True)
                continue
            if path == "c":  # onnxruntime's own kernels have NEON and SSE paths: faster
                return KernelStatus(None, "no vector path for this CPU in meshd's kernel (it "
                                          "has AVX2 and AVX-512 VNNI ones)")
            return KernelStatus(lib, path)
        raise AssertionError("unreachable")
    except (OSError, subprocess.SubprocessError) as err:
        return KernelStatus(None, f"cannot build it: {err}")


def header_api_version(include: Path) -> int | None:
    """The C API version a header declares (``#define ORT_API_VERSION N``)."""
    try:
        text = (include / HEADER).read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"^#define ORT_API_VERSION (\d+)", text, re.M)
    return int(m.group(1)) if m else None


def ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def _runtime_api_version() -> int:
    """The newest C API version this onnxruntime serves: its minor version (1.N serves N)."""
    try:
        return int(ort_version().split(".")[1])
    except (IndexError, ValueError):
        return 0


@functools.cache
def library() -> Path | None:
    """The built library, or None (logged once, with the reason)."""
    st = status()
    if st.library is None:  # a warning: a 4-bit model runs markedly slower without it
        (log.info if st.reason == "MESHD_Q4_KERNEL=0" else log.warning)(
            "q4 kernel unavailable reason=%s (4-bit products run as MatMulNBits)", st.reason)
    else:
        log.info("q4 kernel loaded path=%s vector=%s", st.library, st.reason)
    return st.library
