#!/usr/bin/env bash
# The checks of issue 14's targets 4 and 5 and issue 16's cost, in one device call, on this tree:
# - GPU tests (TESTS; bench.parallel_tests), among them determinism and the bounds-safety cases;
# - beside them, compute-sanitizer: memcheck on every bad-value case (tests/test_bounds_safety.py
#   as a script, each backend) and on the chained step's tests, racecheck on the sm90 kernel;
# - ragged batches beside the uniform ones of the same work (bench.verify --cases ragged_pairs);
# - the preparation alone (bench.time_prepare) for this tree and the trees under .snap/ named on
#   the command line (e.g. old = 8e904e0, the last before the bounds checks: their cost), one after
#   another; the status's cost on the step (bench/time_status.py).
#   run(command="bash bench/device_targets.sh pdl old", carry=[".whl", ".snap"])
# Writes $OUT/targets.tgz (every log) and $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD R=/tmp/targets; mkdir -p $R
source bench/device_common.sh
start_device_run || exit 1
export DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
(PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=/tmp/ddc timeout 240 python3 "$root/bench/build_libraries.py" > $R/build.log 2>&1) &
for tree in "$@"; do
  [ -f ".snap/$tree/bench/time_prepare.py" ] || cp bench/time_prepare.py ".snap/$tree/bench/"
  in_snap_tree "$tree" timeout 240 python3 -c 'import ddtree_op.build as b; b.load_library("prep")' > "$R/build_$tree.log" 2>&1 &
done
wait
for f in $R/build*.log; do echo "== $f"; grep -v DEBUG "$f" | tail -n 1; done; echo "built at $SECONDS s"
export PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=/tmp/ddc
tests=${TESTS:-tests/test_gpu_determinism.py tests/test_bounds_safety.py tests/test_bounds_args.py tests/test_gpu_prep.py \
  tests/test_gpu_dependent_launch.py tests/test_gpu_graphs.py tests/test_paged.py tests/test_opcheck.py tests/test_compile.py}
python3 -m bench.parallel_tests --processes ${PROCESSES:-10} --timeout ${TEST_S:-260} --log-dir /tmp/tests $tests > $R/gpu_tests.log 2>&1 &
sanitize() {  # NAME TOOL COMMAND...: under compute-sanitizer, its last lines and exit status kept
  local name=$1 tool=$2; shift 2
  timeout ${SANITIZE_S:-260} compute-sanitizer --tool "$tool" --print-limit 20 --error-exitcode 9 --target-processes all "$@" \
    > "$R/$name.log" 2>&1
  echo "$name: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$R/$name.log" | tail -n 1))" >> $R/sanitizers.txt
}
for backend in sm90 triton; do
  sanitize memcheck_bad_values_$backend memcheck python3 tests/test_bounds_safety.py --all --device cuda --backend $backend &
done
sanitize memcheck_chained_steps memcheck python3 -m pytest -q -p no:cacheprovider tests/test_gpu_dependent_launch.py &
sanitize racecheck_sm90 racecheck python3 -m pytest -q -p no:cacheprovider tests/test_gpu_determinism.py \
  -k "sm90 and (H16-B1-n4 or H16-B3 or H128-B8)" &
wait
echo "tests and sanitizers at $SECONDS s"; tail -n 2 $R/gpu_tests.log; cat $R/sanitizers.txt
timeout 150 python3 -m bench.verify --cases ragged_pairs --backends sm90 --out /tmp/r_ragged 2>&1 | grep --line-buffered -E "^NVIDIA|wrote"
cp /tmp/r_ragged/results.json $R/ragged_pairs.json 2>/dev/null; echo "ragged at $SECONDS s"
timeout 60 python3 -m bench.time_prepare grid > $R/prep_main.log 2>&1; echo "main: $(tail -n 1 $R/prep_main.log)"
for tree in "$@"; do
  in_snap_tree "$tree" timeout 60 python3 -m bench.time_prepare grid > "$R/prep_$tree.log" 2>&1; echo "$tree: $(tail -n 1 "$R/prep_$tree.log")"
done
names=$(python3 -c "from bench.cases import grid_cases; print(','.join(c.name for c in grid_cases()))")
[ "$SECONDS" -lt "${STATUS_DEADLINE_S:-520}" ] && timeout 70 python3 bench/time_status.py "$names" --backend sm90 > $R/status_cost_grid.log 2>&1
tail -n 1 $R/status_cost_grid.log 2>/dev/null
{ tail -n 2 $R/gpu_tests.log; cat $R/sanitizers.txt; for f in $R/prep_*.log; do echo "$f: $(tail -n 1 "$f")"; done; } > $OUT/summary.txt
[ -d /tmp/tests ] && tar czf $R/test_logs.tgz -C /tmp tests
tar czf $OUT/targets.tgz -C $R .
echo "done at $SECONDS s"
