#!/usr/bin/env bash
# The GPU checks of a lent GPU machine, in two calls that fit its short lease (docs/results.md,
# "On a GPU"). Each stage has its own time limit and writes its log under $OUT, so a stage
# that runs long or fails still leaves the others' results.
#
#   scripts/gpu_checks.sh paths   # the GPU tests, the compiled bound, the tuned example
#   scripts/gpu_checks.sh suite   # the example under scalerun launch + report, the suite
#
# The machine has its own python3 with torch and most of scalerun's dependencies but no
# package index: the rest travel as wheels in .whl/ (python-hostlist, hjson, pexpect, the
# pinned pytest and xdist). The working tree's src/ is put on that python's path with a
# .pth file, as an editable install would, so the code checked is the tree's.
set -u
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
PY=python3
START=$(date +%s)
say() { echo "== $(date +%T) +$(( $(date +%s) - START ))s $*"; }

setup() {
    # Into the machine's own environment, as `pip install -e .` would: every process a test
    # starts with a cleaned environment must import scalerun too (a PYTHONPATH does not
    # reach those: the first run, on 2026-11-28, lost tests to that).
    if [ -d .whl ]; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            .whl/*.whl || { say "wheels failed to install"; exit 3; }
    fi
    $PY -m pip uninstall -q -y scalerun >/dev/null 2>&1
    echo "$PWD/src" > "$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/scalerun-tree.pth"
    printf '#!%s\nimport sys\nfrom scalerun.cli import main\nsys.exit(main())\n' "$(command -v $PY)" \
        > /usr/local/bin/scalerun && chmod +x /usr/local/bin/scalerun
    export PYTHONUNBUFFERED=1
    export SCALERUN_RUNS=/tmp/scalerun-runs
    say "machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader
    echo "cpus $(nproc)"
    $PY -c "import torch, scalerun, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'gpus', torch.cuda.device_count(), 'scalerun from', scalerun.__file__)"
}

stage() {  # stage NAME SECONDS CMD...: run CMD under a limit, its output into $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    say "stage $name (limit ${limit}s): $*"
    timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local code=$?
    say "stage $name: exit $code"
    tail -n 25 "$OUT/$name.log"
}

paths() {
    stage gpu-tests 170 $PY -m pytest -q -p no:cacheprovider -m gpu -o addopts="" -rA \
        tests/test_gpu_paths.py tests/benchmarks/test_smoke.py
    stage gpu-bound 80 $PY benchmarks/gpu_bound.py --model b16 --batch-size 128 \
        --variants compiled --repeat 3 --out "$OUT/gpu_bound.json"
    $PY examples/vit/make_data.py --out /tmp/vit/data.hdf5 --samples 8192 --classes 200 --seed 0
    # No precision or compile flag: the tuner chooses them (issue 21's GPU target), at the
    # bound's batch of 128 so that the two are the same work per step.
    stage tune 200 scalerun tune --nproc-per-node 1 --budget 150s --batch 128 --max-batch 128 \
        --steps 40 --check-pairs 1 --out /tmp/tune -- examples/vit/train.py --model b16 \
        --data /tmp/vit/data.hdf5 --no-generate --batch-size '{per_rank_batch}' --epochs 1000 \
        --out /tmp/vit/model.pt --checkpoint /tmp/vit/ckpt
    cp /tmp/tune/tune.json "$OUT/tune.json" 2>/dev/null
}

suite() {
    $PY examples/vit/make_data.py --out /tmp/vit/data.hdf5 --samples 8192 --classes 200 --seed 0
    stage example 90 scalerun launch --nproc-per-node 1 --run-dir /tmp/vit/run \
        examples/vit/train.py --model b16 --data /tmp/vit/data.hdf5 --no-generate \
        --batch-size 128 --max-steps 300 --epochs 100 --out /tmp/vit/model.pt \
        --checkpoint /tmp/vit/ckpt2
    stage report 30 scalerun report /tmp/vit/run
    cp /tmp/vit/run/report.md "$OUT/example-report.md" 2>/dev/null
    cat /tmp/vit/run/monitor/* > "$OUT/example-monitor.jsonl" 2>/dev/null
    # The whole suite but the SLURM tests (no SLURM on that machine) and the GPU ones (the
    # first call ran them), one worker per core.
    stage suite "${SUITE_LIMIT:-250}" $PY -m pytest -p no:cacheprovider -n "$(nproc)" \
        --dist loadgroup -m "not slurm and not gpu" -o addopts="" -v --timeout 200 -rfE
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/suite.log" | tail -n 60
    echo "suite tallies: $(grep -c ' PASSED ' "$OUT/suite.log") passed, $(grep -c ' FAILED ' "$OUT/suite.log") failed, $(grep -c ' SKIPPED ' "$OUT/suite.log") skipped, $(grep -c ' ERROR ' "$OUT/suite.log") errors (from the -v lines)"
}

setup
case "${1:-}" in
    paths) paths ;;
    suite) suite ;;
    *) echo "usage: scripts/gpu_checks.sh paths|suite" >&2; exit 2 ;;
esac
say "done"
