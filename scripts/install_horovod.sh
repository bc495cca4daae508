#!/usr/bin/env bash
# Install Horovod 0.28.1 (the last release, 2023) into a venv, built against its torch.
#
# Why a script: the sdist asks CMake for C++14 but torch >= 2.1 headers need C++17, so
# `pip install horovod` fails. We patch the two CMakeLists.txt lines, build once without
# build isolation (the build must see the venv's torch), and cache the wheel, because the
# build takes ~12 minutes on 2 cores. The next install takes seconds.
#
# Usage: scripts/install_horovod.sh [PYTHON]      (default: .venv/bin/python)
# Env:   SCALERUN_WHEEL_CACHE  wheel cache folder (default ~/.cache/scalerun/wheels)
#        HOROVOD_BUILD_JOBS    parallel compile jobs (default: number of cores)
# Needs: cmake, a C++17 compiler (g++), the venv's torch already installed.
set -euo pipefail

PY="${1:-.venv/bin/python}"
VERSION=0.28.1
CACHE="${SCALERUN_WHEEL_CACHE:-$HOME/.cache/scalerun/wheels}"
JOBS="${HOROVOD_BUILD_JOBS:-$(nproc)}"

if "$PY" -c "import horovod.torch" 2>/dev/null; then
    echo "horovod: already importable in $PY"
    exit 0
fi

# The wheel is tied to the torch it was compiled against: key the cache by torch version.
TORCH="$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"))')"
KEYED="$CACHE/torch-$TORCH"
mkdir -p "$KEYED"
WHEEL="$(ls "$KEYED"/horovod-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)"

if [ -z "$WHEEL" ]; then
    command -v cmake >/dev/null || { echo "horovod: cmake is missing (apt-get install -y cmake)" >&2; exit 1; }
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    echo "horovod: building $VERSION against torch $TORCH in $WORK (about 12 minutes on 2 cores)"
    "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK"
    tar -xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
    SRC="$WORK/horovod-$VERSION"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$SRC/horovod/torch/CMakeLists.txt"
    # Build requirements that --no-build-isolation expects in the venv itself.
    "$PY" -m pip install -q "setuptools>=64" wheel packaging cloudpickle psutil pyyaml
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$JOBS" \
        "$PY" -m pip wheel -q --no-build-isolation --no-deps "$SRC" -w "$WORK/dist"
    cp "$WORK"/dist/horovod-"$VERSION"-*.whl "$KEYED/"
    WHEEL="$(ls "$KEYED"/horovod-"$VERSION"-*.whl | head -n 1)"
fi

echo "horovod: installing $WHEEL"
"$PY" -m pip install -q "$WHEEL"
"$PY" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'horovod built without gloo'"
echo "horovod: ok"
