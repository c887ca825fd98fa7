#!/usr/bin/env bash
# Build llama.cpp's command-line tools (llama-server, llama-bench, llama-cli,
# llama-tokenize, llama-perplexity) from the llama.cpp source vendored in the
# llama-cpp-python sdist, for side-by-side benchmarks and live tests.
# llama.cpp is a measuring stick for meshd, never a dependency of it.
#
# Usage: scripts/build_llama_cpp.sh [SDIST.tar.gz]
#   SDIST          the llama-cpp-python sdist; default: $LLAMA_CPP_SDIST, else
#                  a cached copy in $BUILD_DIR/dl, else `pip download` of the
#                  pinned version. Its sha256 must match the pin below.
#   BUILD_DIR      where to build (default <repo>/build/llama.cpp); the binaries
#                  land in $BUILD_DIR/bin. Point every worktree at one place,
#                  e.g. BUILD_DIR=/work/main/build/llama.cpp.
#   JOBS           parallel compile jobs (default: nproc)
#   PYTHON         python used for `pip download` (default: python3)
#
# Idempotent: when every binary exists and $BUILD_DIR/STAMP names the pinned
# sdist (version and sha256), it prints the binaries and exits.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TOOLS=(llama-server llama-bench llama-cli llama-tokenize llama-perplexity)

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$repo/build/llama.cpp}
jobs=${JOBS:-$(nproc)}
python=${PYTHON:-python3}
sdist_name=llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
stamp_want="llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sha256 $LLAMA_CPP_PYTHON_SHA256"

print_bins() {
    echo "llama.cpp binaries ($stamp_want):"
    for t in "${TOOLS[@]}"; do echo "  $build_dir/bin/$t"; done
}

have_all() {
    [[ -f $build_dir/STAMP && $(cat "$build_dir/STAMP") == "$stamp_want" ]] || return 1
    for t in "${TOOLS[@]}"; do [[ -x $build_dir/bin/$t ]] || return 1; done
}

if have_all; then
    echo "up to date, nothing to build"
    print_bins
    exit 0
fi

mkdir -p "$build_dir/dl"
sdist=${1:-${LLAMA_CPP_SDIST:-}}
if [[ -z $sdist ]]; then
    sdist=$build_dir/dl/$sdist_name
    if [[ ! -f $sdist ]]; then
        echo "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist"
        "$python" -m pip download --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$build_dir/dl"
    fi
fi
[[ -f $sdist ]] || { echo "no sdist at $sdist" >&2; exit 2; }
got=$(sha256sum "$sdist" | cut -d' ' -f1)
if [[ $got != "$LLAMA_CPP_PYTHON_SHA256" ]]; then
    echo "sha256 mismatch for $sdist: got $got, pinned $LLAMA_CPP_PYTHON_SHA256" >&2
    exit 2
fi

src_root=$build_dir/src
src=$src_root/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp
if [[ ! -f $src/CMakeLists.txt ]]; then
    rm -rf "$src_root"
    mkdir -p "$src_root"
    tar -xzf "$sdist" -C "$src_root"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# LLAMA_CURL is deprecated (ignored) in this llama.cpp; LLAMA_OPENSSL=OFF is
# what now turns the HTTPS model download off. The web UI is neither built
# (npm) nor downloaded: the server serves a placeholder page.
cmake -S "$src" -B "$build_dir/cmake" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DBUILD_SHARED_LIBS=OFF
cmake --build "$build_dir/cmake" --config Release -j "$jobs" --target "${TOOLS[@]}"

# llama.cpp's CMakeLists puts executables in <cmake build>/bin whatever the command line
# says; static libraries make each one self-contained, so a copy runs from anywhere.
mkdir -p "$build_dir/bin"
for t in "${TOOLS[@]}"; do
    src_bin=$build_dir/cmake/bin/$t
    [[ -x $src_bin ]] || { echo "missing after build: $src_bin" >&2; exit 1; }
    install -m 755 "$src_bin" "$build_dir/bin/$t"
done
echo "$stamp_want" >"$build_dir/STAMP"
print_bins
