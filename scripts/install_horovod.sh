#!/usr/bin/env bash
# Install Horovod 0.28.1 (the last release, 2023) into a venv, built against its torch.
#
# Why a script: the sdist asks CMake for C++14 but torch >= 2.1 headers need C++17, so
# `pip install horovod` fails. We patch the two CMakeLists.txt lines, build once without
# build isolation (the build must see the venv's torch), and cache the wheel, because the
# build takes ~12 minutes on 2 cores. The next install takes seconds.
#
# The build variables come from a site profile's [horovod] table, through
# `python -m scalerun.commands.horovod_env SITE`: the default site, local, is the CPU build
# (gloo, no MPI); `--site lumi-g` is the course's ROCm build (HOROVOD_GPU=ROCM,
# HOROVOD_GPU_OPERATIONS=NCCL, HOROVOD_ROCM_HOME, rccl_ROOT, HCC_AMDGPU_TARGET=gfx90a),
# run inside LUMI's container where ROCM_PATH is set.
#
# Usage: scripts/install_horovod.sh [--site NAME] [--print-env] [PYTHON]
#          --site NAME   build variables of this site profile (default: local, CPU)
#          --print-env   print the variables the build would use, and stop
#          PYTHON        the venv's interpreter (default: .venv/bin/python)
# Env:   SCALERUN_WHEEL_CACHE  wheel cache folder (default ~/.cache/scalerun/wheels)
#        HOROVOD_BUILD_JOBS    parallel compile jobs (default: number of cores)
# Needs: cmake, a C++17 compiler (g++), the venv's torch and scalerun already installed.
set -euo pipefail

SITE=local
PRINT_ENV=0
PY=.venv/bin/python
while [ $# -gt 0 ]; do
    case "$1" in
        --site) SITE="${2:?--site needs a site name}"; shift 2 ;;
        --site=*) SITE="${1#--site=}"; shift ;;
        --print-env) PRINT_ENV=1; shift ;;
        -*) echo "horovod: unknown option $1 (see the usage at the top of $0)" >&2; exit 2 ;;
        *) PY="$1"; shift ;;
    esac
done
VERSION=0.28.1
CACHE="${SCALERUN_WHEEL_CACHE:-$HOME/.cache/scalerun/wheels}"
JOBS="${HOROVOD_BUILD_JOBS:-$(nproc)}"

if [ "$PRINT_ENV" = 1 ]; then
    echo "# Horovod $VERSION build variables of site $SITE"
    "$PY" -m scalerun.commands.horovod_env "$SITE"
    exit 0
fi

if "$PY" -c "import horovod.torch" 2>/dev/null; then
    echo "horovod: already importable in $PY"
    exit 0
fi

BUILD_ENV="$("$PY" -m scalerun.commands.horovod_env "$SITE" --require-set)"
TAG="$("$PY" -m scalerun.commands.horovod_env "$SITE" --tag)"
# The wheel is tied to the torch it was compiled against (and to the site's GPU build):
# key the cache by both; the CPU build keeps the plain torch key.
TORCH="$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"))')"
KEYED="$CACHE/torch-$TORCH${TAG:+-$TAG}"
mkdir -p "$KEYED"
WHEEL="$(ls "$KEYED"/horovod-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)"

if [ -z "$WHEEL" ]; then
    command -v cmake >/dev/null || { echo "horovod: cmake is missing (apt-get install -y cmake)" >&2; exit 1; }
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    echo "horovod: building $VERSION for site $SITE against torch $TORCH in $WORK (about 12 minutes on 2 cores)"
    "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK"
    tar -xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
    SRC="$WORK/horovod-$VERSION"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$SRC/horovod/torch/CMakeLists.txt"
    # Build requirements that --no-build-isolation expects in the venv itself.
    "$PY" -m pip install -q "setuptools>=64" wheel packaging cloudpickle psutil pyyaml
    (
        echo "$BUILD_ENV" | sed 's/^/horovod: /'
        eval "$BUILD_ENV"
        export MAKEFLAGS="-j$JOBS"
        "$PY" -m pip wheel -q --no-build-isolation --no-deps "$SRC" -w "$WORK/dist"
    )
    cp "$WORK"/dist/horovod-"$VERSION"-*.whl "$KEYED/"
    WHEEL="$(ls "$KEYED"/horovod-"$VERSION"-*.whl | head -n 1)"
fi

echo "horovod: installing $WHEEL"
"$PY" -m pip install -q "$WHEEL"
"$PY" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'horovod built without gloo'"
echo "horovod: ok"
