#!/usr/bin/env bash
# The line coverage of src/ by the whole suite, subprocesses included (issue 28: the suite
# may get faster, never thinner). Run from a checkout whose `make test` set-up is done:
#
#     scripts/coverage_suite.sh [OUT_DIR]       # default: runs/coverage
#
# Every Python process the suite starts is measured: pytest's workers, launchers, ranks
# forked by the warm starter, `scalerun exec`, SLURM jobs (they inherit the environment).
# coverage.py's own patches do it (`[run] patch`, coverage >= 7.10): `subprocess` puts a .pth
# file in the venv that starts coverage where COVERAGE_PROCESS_START is set, `fork` gives
# each forked rank a data file of its own, `_exit` and `execv` save before a process ends
# that way. Processes a test starts with a scrubbed environment, and images that hide the
# host's Python, are not measured: the figure is a floor, comparable between two commits.
# Prints the total last and writes OUT_DIR/coverage.json; the suite's time is not
# representative under coverage (the measure slows Python code), `make test` is.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-runs/coverage}")
rm -rf "$out" && mkdir -p "$out"
PY=.venv/bin/python
make -s .venv/.installed .venv/.extras >/dev/null || exit 1
$PY -m pip install -q 'coverage>=7.10' || exit 1
cat > "$out/coveragerc" <<EOF
[run]
source_pkgs = scalerun
parallel = true
data_file = $out/data/.coverage
patch = subprocess, fork, _exit, execv
disable_warnings = no-data-collected, module-not-measured, module-not-imported, couldnt-parse
[report]
precision = 1
EOF
mkdir -p "$out/data"
export COVERAGE_PROCESS_START="$out/coveragerc"
start=$(date +%s)
SCALERUN_REQUIRE_EXTRAS=1 $PY -m coverage run --rcfile="$out/coveragerc" -m pytest -q -n "${TEST_WORKERS:-3}" \
    --dist loadgroup -p no:cacheprovider > "$out/pytest.log" 2>&1
code=$?
unset COVERAGE_PROCESS_START
tail -3 "$out/pytest.log"
$PY -m coverage combine --rcfile="$out/coveragerc" -q "$out/data" || exit 1
$PY -m coverage report --rcfile="$out/coveragerc" --data-file="$out/data/.coverage" > "$out/report.txt"
$PY -m coverage json --rcfile="$out/coveragerc" --data-file="$out/data/.coverage" -q -o "$out/coverage.json"
echo "coverage: pytest exit $code, $(( ($(date +%s) - start) / 60 )) min; $(tail -1 "$out/report.txt")"
