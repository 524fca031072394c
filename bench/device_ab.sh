#!/usr/bin/env bash
# Kernel variants A/B in one device call: trees under .snap/ (bench/snapshot_trees.sh), the first
# one the base. Builds every tree (and, with WAIT_CLOCKS=1, its debug build) in parallel, runs
# each variant's sm90 tests side by side (a failing variant is not timed), times attention alone on
# ${CASES:-grid} (CASE_FILTER: bench.verify's --filter) for each tree one after another (sm90,
# paged:sm90, FlashMLA beside), compares them (bench/compare_runs.py) and, with WAIT_CLOCKS=1,
# prints each tree's wait clocks and its timeline of one pair (wait_clocks.cuh). AB_TESTS: the
# variants' pytest arguments instead of the sm90 tests, split at spaces (so a -k expression must
# be one word). AB_BACKENDS: the timed columns (default sm90,paged:sm90,flashmla).
# WITH_PREP=1 times the preparation and the one-call step too (a change to the preparation must
# be timed with it: the pieces' A/Bs without it missed +2.4 to +6.9 µs of preparation).
#   run(command="bash bench/device_ab.sh main v14", carry=[".whl", ".snap"])
# Writes under $OUT: ab.txt, grid_<tree>.json, tests.log, wait_clocks.log, build.log.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source bench/device_common.sh
[ $# -ge 1 ] || { echo "usage: device_ab.sh TREE... (under .snap/)"; exit 2; }
start_device_run || exit 1
for tree in "$@"; do
  in_snap_tree "$tree" timeout "${BUILD_TIMEOUT:-300}" python3 "$root/bench/build_libraries.py" > "/tmp/build_$tree.log" 2>&1 &
  [ "${WAIT_CLOCKS:-0}" = 1 ] && in_clock_tree "$tree" timeout "${BUILD_TIMEOUT:-300}" python3 "$root/bench/build_libraries.py" > "/tmp/build_${tree}_wc.log" 2>&1 &
done
wait
for f in /tmp/build_*.log; do echo "== $f"; grep -v DEBUG "$f" | tail -n 2; done > "$OUT/build.log"
echo "built at $SECONDS s"
# Correctness only, so the variants' tests share the GPU; the timing below runs alone.
for tree in "${@:2}"; do
  in_snap_tree "$tree" timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -x -q -p no:cacheprovider ${AB_TESTS:-tests/test_gpu_sm90.py \
    tests/test_gpu_attention.py tests/test_gpu_persistent.py tests/test_paged.py -k sm90} > "/tmp/tests_$tree.log" 2>&1 &
done
wait
timed=("$1")
for tree in "${@:2}"; do
  variant_tests_passed "$tree" && timed+=("$tree")
done
echo "tested at $SECONDS s"
specs=()
for tree in "${timed[@]}"; do
  in_snap_tree "$tree" timeout "${GRID_TIMEOUT:-170}" python3 -m bench.verify --cases "${CASES:-grid}" ${CASE_FILTER:+--filter "$CASE_FILTER"} $([ "${WITH_PREP:-0}" = 1 ] || echo --no-prep) \
    --backends "${AB_BACKENDS:-sm90,paged:sm90,flashmla}" --out "/tmp/r_$tree" 2>&1 | grep --line-buffered -E "^NVIDIA|wrote" 
  cp "/tmp/r_$tree/results.json" "$OUT/grid_$tree.json" && specs+=("$tree=$OUT/grid_$tree.json")
  echo "$tree timed at $SECONDS s"
done
columns=sm90,paged:sm90; [ "${WITH_PREP:-0}" = 1 ] && columns=$columns,prepare_fused,step[sm90]
PYTHONPATH=$root python3 -m bench.compare_runs "${specs[@]}" --columns "$columns" > "$OUT/ab.txt" 2>&1
grep -E "^sm90|^paged|^prepare|^step" "$OUT/ab.txt"
if [ "${WAIT_CLOCKS:-0}" = 1 ]; then
  # WAIT_CLOCK_CASES="SHAPE BACKEND [--fp8];...": the cases profiled, instead of the default five.
  IFS=';' read -r -a WAIT_CLOCK_CASES <<< "${WAIT_CLOCK_CASES:-H128_n64_B8_P8192 paged:sm90;H128_n64_B8_P8192 sm90;H16_n4_B1_P1024 sm90;H128_n64_B8_P8192 sm90 --fp8;H16_n4_B8_P8192 sm90 --fp8}"
  for tree in "$@"; do
    for case in "${WAIT_CLOCK_CASES[@]}"; do
      read -r shape backend extra <<< "$case"
      echo "== $tree $shape $backend $extra"
      print_wait_clocks "$tree" 40 "$shape" --backend "$backend" $extra
    done
  done > "$OUT/wait_clocks.log"
fi
tail -n 4 "$OUT/tests.log"
