#!/usr/bin/env bash
# The real model on onnxruntime's CUDA execution provider, on a lent GPU machine that reaches
# no package registry: stage here, carry in parts, run there (benchmarks/bench_cuda.py).
#
#   scripts/device_cuda.sh stage [GGUF]   here: onnxruntime-gpu and the GGUF, packed and cut
#                                         into parts under build/device/parts/
#   scripts/device_cuda.sh run            there: join the parts, import the model, run the
#                                         benchmark; writes $OUT/cuda.json (or build/device/)
#
# Why parts: a device call carries the working tree and at most 64 MiB in all; the tree is about
# 36 MB, onnxruntime-gpu (CUDA 13, cuDNN 9, Python 3.12: the device image's) is 256 MB as a
# wheel and the GGUF 98 MB. Packed with xz they are about 300 MB: 11 parts of 27 MiB (PART_MIB).
# Each call carries one part (`carry: ["build/device/parts/p00"]`, a no-op command); a part
# carried earlier stays there while the machine is warm (30 s idle), so make the calls back to
# back, then `bash scripts/device_cuda.sh run` with the last part carried. `stage` prints the
# calls. The image's own onnxruntime has no CUDA provider; the one unpacked here goes first on
# PYTHONPATH, and the CUDA libraries come from the image's nvidia-* Python packages.
set -euo pipefail

ORT_GPU_VERSION=1.31.1
ORT_GPU_WHEEL=onnxruntime_gpu-$ORT_GPU_VERSION-cp312-cp312-manylinux_2_28_x86_64.whl
ORT_GPU_SHA256=05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PART_MIB=${PART_MIB:-27}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dev=$repo/build/device
python=${PYTHON:-python3}

check_sha() {  # FILE SHA256
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    [[ $got == "$2" ]] || { echo "error: $1: sha256 $got, pinned $2" >&2; exit 1; }
}

stage() {
    local gguf=${1:-$repo/build/gguf/$GGUF_NAME}
    [[ -f $gguf ]] || { echo "error: $gguf not found (meshd model pull smollm2-135m-instruct, or name the GGUF)" >&2; exit 1; }
    check_sha "$gguf" "$GGUF_SHA256"
    mkdir -p "$dev/dl"
    if [[ ! -f $dev/dl/$ORT_GPU_WHEEL ]]; then
        "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 -d "$dev/dl" \
            "onnxruntime-gpu==$ORT_GPU_VERSION"
    fi
    check_sha "$dev/dl/$ORT_GPU_WHEEL" "$ORT_GPU_SHA256"
    rm -rf "$dev/pack" "$dev/parts"
    mkdir -p "$dev/pack/site" "$dev/parts"
    # a wheel is the package as it is installed: unpacked into a folder that goes on PYTHONPATH
    "$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$dev/dl/$ORT_GPU_WHEEL" "$dev/pack/site"
    cp "$gguf" "$dev/pack/$GGUF_NAME"
    tar -C "$dev/pack" -cf - site "$GGUF_NAME" | xz -T0 -6 | split -b "${PART_MIB}m" -d -a 2 - "$dev/parts/p"
    rm -rf "$dev/pack"
    (cd "$dev/parts" && sha256sum p* > ../parts.sha256)
    local parts=("$dev"/parts/p*) last
    last=$(basename "${parts[-1]}")
    echo "staged ${#parts[@]} parts ($(du -sh "$dev/parts" | cut -f1)) in build/device/parts; the device calls, back to back:"
    for p in "${parts[@]}"; do
        p=$(basename "$p")
        if [[ $p == "$last" ]]; then
            echo "  run(command='bash scripts/device_cuda.sh run', carry=['build/device/parts/$p', 'build/device/parts.sha256'], timeout_s=600)"
        else
            echo "  run(command='ls -l build/device/parts', carry=['build/device/parts/$p'], timeout_s=60)"
        fi
    done
}

run() {
    local out=${OUT:-$dev} work=/tmp/meshd-device
    (cd "$dev/parts" && sha256sum -c --quiet ../parts.sha256) || {
        echo "error: parts missing or damaged (the machine went back between calls?): stage and carry them again" >&2
        ls -l "$dev/parts" >&2
        exit 1
    }
    rm -rf "$work" && mkdir -p "$work"
    cat "$dev"/parts/p* | "$python" -c \
        'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1])' "$work"
    check_sha "$work/$GGUF_NAME" "$GGUF_SHA256"
    # the CUDA, cuBLAS, cuDNN, cuFFT and cuRAND libraries of the image's nvidia-* packages
    local libs
    libs=$("$python" - <<'EOF'
import glob, os, site, sys
roots = [p for p in sys.path if p.endswith("-packages")] + site.getsitepackages()
dirs = {os.path.dirname(f) for r in roots for f in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True)}
print(":".join(sorted(dirs)))
EOF
)
    # and the driver's libcuda, where the image mounts it
    export LD_LIBRARY_PATH=$libs:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PYTHONPATH=$work/site:$repo
    ldd "$work/site/onnxruntime/capi/libonnxruntime_providers_cuda.so" | grep "not found" \
        > "$out/ldd-missing.txt" || true
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
    "$python" -c 'import sys; from pathlib import Path; from meshd.engine.gguf_import import import_gguf; import_gguf(Path(sys.argv[1]), Path(sys.argv[2]))' \
        "$work/$GGUF_NAME" "$work/model"
    PYTHONUNBUFFERED=1 "$python" "$repo/benchmarks/bench_cuda.py" --model "$work/model" \
        --out "$out/cuda.json" 2>&1 | tee "$out/bench_cuda.log"
}

case ${1:-} in
    stage) shift; stage "$@" ;;
    run) run ;;
    *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
