#!/usr/bin/env bash
# The debug clocks of trees under .snap/ (bench/snapshot_trees.sh) in one device call: builds
# with ${CLOCK_FLAGS} (default both -DDDTREE_WAIT_CLOCKS, for transposed_clocks.cuh and
# wait_clocks.cuh, and -DDDTREE_PLAN_CLOCKS, for plan_clocks.cuh), in parallel, then per tree
#  - the transposed FP8 kernel's waits (CTA 0) and every CTA's timeline on ${WAIT_CASES} at each
#    forced split count in ${SPLITS} (0: auto's), so that tile landing under load (many CTAs) is
#    read beside few CTAs; then the bf16 kernel's (split or persistent, as auto picks) on
#    ${BF16_WAIT_CASES} (default none); ${CLOCK_ITERS} launches each (default 1: a block of lines
#    a launch);
#  - the plan's phases (medians over launches) in the whole bf16 step on ${PLAN_CASES}, and hot
#    (bench.time_prepare --plan).
# An empty list skips its part (WAIT_CASES= or PLAN_CASES=).
#   bash bench/snapshot_trees.sh main=HEAD
#   run(command="bash bench/device_clocks.sh main", carry=[".whl", ".snap"])
# Writes under $OUT: clocks_build_<tree>.log, wait_clocks_<tree>.log, plan_clocks_<tree>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source bench/device_common.sh
start_device_run || exit 1
export DDTREE_NVCC_EXTRA="${CLOCK_FLAGS:--DDDTREE_WAIT_CLOCKS -DDDTREE_PLAN_CLOCKS}"
for tree in "$@"; do
  in_snap_tree "$tree" timeout "${BUILD_TIMEOUT:-400}" python3 "$root/bench/build_libraries.py" \
    > "$OUT/clocks_build_$tree.log" 2>&1 &
done
wait
echo "built at $SECONDS s"

# The lines' count and each field's median (the plan prints one line a launch).
median_fields() {
  python3 -c '
import re, statistics, sys
rows = [[int(v) for v in re.findall(r"(-?\d+)", line)] for line in sys.stdin]
names = ["B", "sanitize", "totals", "choice", "piece search", "scan", "writes", "all"]
print(f"{len(rows)} launches; median cycles:", ", ".join(f"{n} {statistics.median(c):.0f}" for n, c in zip(names, zip(*rows))) if rows else "none")'
}

for tree in "$@"; do
  {
    for shape in ${WAIT_CASES-H16_n1_B32_P8192 H16_n1_B8_P8192}; do
      for splits in ${SPLITS:-0 1 2}; do
        echo "== $tree $shape --fp8 --splits $splits"
        DDTREE_SM90_FP8_KERNEL=transposed in_snap_tree "$tree" timeout 90 python3 -m bench.profile_case "$shape" \
          --backend sm90 --fp8 --splits "$splits" --iters "${CLOCK_ITERS:-1}" 2>&1 | grep -E "^wait_clocks"
      done
    done
    for shape in ${BF16_WAIT_CASES-}; do
      echo "== $tree $shape bf16 attention"
      in_snap_tree "$tree" timeout 90 python3 -m bench.profile_case "$shape" --backend sm90 --iters "${CLOCK_ITERS:-1}" \
        2>&1 | grep -E "^wait_clocks"
    done
  } > "$OUT/wait_clocks_$tree.log"
  for shape in ${PLAN_CASES-H16_n4_B1_P1024 H16_n1_B8_P8192 H16_n1_B32_P8192}; do
    echo "== $tree $shape, the whole bf16 step"
    in_snap_tree "$tree" timeout 120 python3 -m bench.profile_case "$shape" --backend sm90 --step --kernels 2>&1 \
      | grep "^plan_clocks" | median_fields
    echo "== $tree $shape, hot (bench.time_prepare --plan)"
    in_snap_tree "$tree" timeout 120 python3 -m bench.time_prepare --plan "$shape" 2>&1 \
      | grep "^plan_clocks" | median_fields
  done > "$OUT/plan_clocks_$tree.log"
  echo "clocks of $tree at $SECONDS s"; cat "$OUT/wait_clocks_$tree.log" "$OUT/plan_clocks_$tree.log"
done
