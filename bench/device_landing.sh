#!/usr/bin/env bash
# What a landing needs from the GPU, in one device call: the GPU tests (TESTS, default: the GPU
# test files; bench.parallel_tests, TEST_S seconds), then the whole step against FlashMLA on the
# grid (bench.verify, with the preparation), the status's cost (bench/time_status.py) and the
# preparation against an older tree in .snap/old (bench.time_prepare, e.g. 8e904e0, the last
# before the bounds checks: bench/snapshot_trees.sh old=8e904e0); COSTS=0 leaves out those two.
# GRID_S: seconds for the grid (default 150; 0 leaves the grid out); GRID_CASES (default grid; all: the README's 66
# shapes) and GRID_BACKENDS (default sm90,flashmla) choose what it times; RACECHECK=1 runs racecheck
# on the sm90 kernel beside the tests. The whole landing in one call (~450 s):
#   TESTS=tests RACECHECK=1 COSTS=0 PROCESSES=14 TEST_S=330 GRID_CASES=all \
#   GRID_BACKENDS=sm90,flashmla,paged:sm90 GRID_S=240 bash bench/device_landing.sh
#   run(command="bash bench/device_landing.sh", carry=[".whl", ".snap"])
# Writes $OUT/landing/ as it goes (so a call cut by its time limit still brings back what it did):
# gpu_tests.log, grid_step.json, status_cost_grid.log, prep_main.log, prep_old.log, build logs,
# test_logs.tgz (the tests' logs).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD R=${OUT:-/tmp}/landing cache=${DDTREE_CACHE_DIR:-/tmp/ddc}; mkdir -p $R
source bench/device_common.sh
start_device_run || exit 1
export DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
(PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=$cache timeout 200 python3 "$root/bench/build_libraries.py" > $R/build.log 2>&1) &
if [ -d .snap/old ]; then
  [ -f .snap/old/bench/time_prepare.py ] || cp bench/time_prepare.py .snap/old/bench/
  (cd .snap/old && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_old timeout 200 python3 -c 'import ddtree_op.build as b; b.load_library("prep")' \
    > $R/build_old.log 2>&1) &
fi
wait
grep -v DEBUG $R/build.log | tail -n 2; echo "built at $SECONDS s"
export PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=$cache
tests=${TESTS:-tests/test_bounds_safety.py tests/test_bounds_args.py tests/test_paged.py tests/test_gpu_prep.py tests/test_gpu_graphs.py \
  tests/test_gpu_sm90.py tests/test_gpu_persistent.py tests/test_gpu_backends.py tests/test_opcheck.py tests/test_compile.py \
  tests/test_gpu_attention.py tests/test_fp8.py}
if [ "$tests" != none ]; then
  if [ "${RACECHECK:-0}" = 1 ]; then  # beside the tests: racecheck on three determinism cases of the sm90 kernel
    timeout ${TEST_S:-200} compute-sanitizer --tool racecheck --print-limit ${RACECHECK_LIMIT:-20} python3 -m pytest -q -p no:cacheprovider \
      tests/test_gpu_determinism.py -k "sm90 and (H16-B1-n4 or H16-B3 or H128-B8)" > $R/racecheck_sm90.log 2>&1 &
  fi
  python3 -m bench.parallel_tests --processes ${PROCESSES:-12} --timeout ${TEST_S:-200} --log-dir /tmp/tests $tests > $R/gpu_tests.log 2>&1
  echo "tests rc $? at $SECONDS s"; tail -n 3 $R/gpu_tests.log
  wait; [ -f $R/racecheck_sm90.log ] && grep -E "RACECHECK SUMMARY|passed|failed" $R/racecheck_sm90.log
fi
[ -d /tmp/tests ] && tar czf $R/test_logs.tgz -C /tmp tests
if [ "${GRID_S:-150}" = 0 ]; then echo "no grid; done at $SECONDS s"; exit 0; fi
timeout ${GRID_S:-150} python3 -m bench.verify --cases ${GRID_CASES:-grid} --backends ${GRID_BACKENDS:-sm90,flashmla} --out $R/step > $R/grid_step.log 2>&1
grep -E "^NVIDIA|wrote" $R/grid_step.log; cp $R/step/results.json $R/grid_step.json 2>/dev/null; echo "step grid at $SECONDS s"
python3 -m bench.step_variants $R/grid_step.json per_layer --small-floor 5 2>&1 | tee $R/per_layer_summary.txt
if [ "${COSTS:-1}" = 0 ]; then
  echo "done at $SECONDS s"; exit 0
fi
names=$(python3 -c "from bench.cases import grid_cases; print(','.join(c.name for c in grid_cases()))")
timeout 150 python3 bench/time_status.py "$names" --backend sm90 > $R/status_cost_grid.log 2>&1; tail -n 1 $R/status_cost_grid.log
timeout 60 python3 -m bench.time_prepare grid > $R/prep_main.log 2>&1; tail -n 1 $R/prep_main.log
if [ -d .snap/old ]; then
  (cd .snap/old && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_old timeout 60 python3 -m bench.time_prepare grid > $R/prep_old.log 2>&1)
  tail -n 1 $R/prep_old.log
fi
echo "done at $SECONDS s"
