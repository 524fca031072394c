#!/usr/bin/env bash
# FP8 gather variants A/B in one device call: trees under .snap/ (bench/snapshot_trees.sh), built
# in parallel; the FP8 sm90 tests (${FP8_TESTS}) of the trees in ${TEST_TREES} (default: the first),
# side by side; then, per tree one after another,
# the whole step with the bf16 cache and with the FP8 cache (`python -m bench.paged_fp8 --steps`, which
# a tree has from the thirty-first session on: slot layout, backend sm90; cases: bench.cases.case_named)
# on ${FP8_CASES}, as the ratio fp8 / bf16 within each tree; with TRITON_TOO=1 the first tree's Triton
# kernel on the FP8 cache too (the backend `auto` chose for FP8 before).
# TEST_TREES= (set, empty) runs no tests. WAIT_CLOCKS=1 builds the trees in ${CLOCK_TREES} (default:
# the first) with -DDDTREE_WAIT_CLOCKS too and, after the steps, prints their wait clocks and
# pair timeline (wait_clocks.cuh) on ${CLOCK_CASES} with the FP8 cache.
#   run(command="bash bench/device_fp8_ab.sh int raw", carry=[".whl", ".snap"])
# f8mma's FP8-compute mode, its clocks, no tests (bench/variants/README.md):
#   DDTREE_SM90_FP8_MMA=1 TEST_TREES= WAIT_CLOCKS=1 bash bench/device_fp8_ab.sh f8mma main
# Writes under $OUT: build.log, tests_<tree>.log, steps_<tree>.txt, wait_clocks.log.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source bench/device_common.sh
start_device_run || exit 1
clock_trees=${CLOCK_TREES:-$1}
for tree in "$@"; do
  in_snap_tree "$tree" timeout "${BUILD_TIMEOUT:-400}" python3 "$root/bench/build_libraries.py" > "/tmp/build_$tree.log" 2>&1 &
done
if [ "${WAIT_CLOCKS:-0}" = 1 ]; then
  for tree in $clock_trees; do
    in_clock_tree "$tree" timeout "${BUILD_TIMEOUT:-400}" python3 "$root/bench/build_libraries.py" > "/tmp/build_${tree}_wc.log" 2>&1 &
  done
fi
wait
for f in /tmp/build_*.log; do echo "== $f"; grep -v DEBUG "$f" | tail -n 3; done > "$OUT/build.log"
echo "built at $SECONDS s"
for tree in ${TEST_TREES-$1}; do
  in_snap_tree "$tree" timeout "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider ${FP8_TESTS:-tests/test_fp8.py -k sm90} \
    > "$OUT/tests_$tree.log" 2>&1 &
done
wait
for tree in ${TEST_TREES-$1}; do echo "== $tree: $(grep -v DEBUG "$OUT/tests_$tree.log" | tail -n 1)"; done
echo "tested at $SECONDS s"
cases=${FP8_CASES:-H16_n4_B8_P8192,H16_n4_B32_P8192,dsv3_H16_chain4_B64_P4k,H16_n16_B32_P8192,H128_n64_B8_P8192}
for tree in "$@"; do
  echo "== $tree"
  triton=$([ "$tree" = "$1" ] && [ "${TRITON_TOO:-0}" = 1 ] && echo --triton)
  in_snap_tree "$tree" timeout "${GRID_S:-150}" python3 -m bench.paged_fp8 "$cases" sm90 --steps $triton 2>&1 \
    | grep -v DEBUG | tee "$OUT/steps_$tree.txt"
done
if [ "${WAIT_CLOCKS:-0}" = 1 ]; then
  for tree in $clock_trees; do
    for shape in ${CLOCK_CASES:-H16_n4_B32_P8192 H128_n64_B8_P8192}; do
      echo "== $tree $shape --fp8"
      print_wait_clocks "$tree" 60 "$shape" --backend sm90 --fp8
    done
  done | tee "$OUT/wait_clocks.log"
fi
