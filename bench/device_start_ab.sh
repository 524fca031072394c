#!/usr/bin/env bash
# The transposed FP8 kernel's start and merge variants in one device call, most telling first, each
# part skipped once the call nears its limit (${LIMIT_S:-560} s): trees under .snap/
# (bench/snapshot_trees.sh: main, and ${VARIANT:-both}, e.g. main + rolled.diff + selfmerge.diff),
# release builds of both and clock builds (-DDDTREE_WAIT_CLOCKS) of main and ${CLOCK_VARIANT:-rolled},
# all in parallel; then
#  1. the variant's transposed FP8 tests (12 processes; where one fails, the variant is not timed);
#  2. the FP8 and bf16 steps of main and the variant, transposed kernel forced (bench.paged_fp8 --steps,
#     one tree after the other) on ${FP8_CASES};
#  3. the per-CTA timeline of main and the clock variant on ${WAIT_CASES} (auto splits, two launches);
#  4. FP8 against bf16 per layer of a forward on the variant (bench.paged_fp8 --per-layer).
#   bash bench/snapshot_trees.sh main=HEAD rolled=HEAD+bench/variants/rolled.diff \
#     both=HEAD+bench/variants/rolled.diff+bench/variants/selfmerge.diff
#   run(command="bash bench/device_start_ab.sh", carry=[".whl", ".snap"])
# Writes under $OUT: build_*.log, tests.log, steps_<tree>.txt, timeline.txt, per_layer.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source bench/device_common.sh
start_device_run || exit 1
variant=${VARIANT:-both} clock_variant=${CLOCK_VARIANT:-rolled} limit=${LIMIT_S:-560}
cases=${FP8_CASES:-H16_n1_B32_P8192,H16_n2_B32_P8192,H16_n4_B8_P8192}
time_left() { [ $((limit - SECONDS)) -gt "$1" ]; }  # more than $1 s left

for tree in main "$variant"; do
  in_snap_tree "$tree" timeout 400 python3 "$root/bench/build_libraries.py" > "$OUT/build_$tree.log" 2>&1 &
done
for tree in main "$clock_variant"; do
  in_clock_tree "$tree" timeout 400 python3 "$root/bench/build_libraries.py" > "$OUT/build_${tree}_clocks.log" 2>&1 &
done
wait
echo "built at $SECONDS s"

in_snap_tree "$variant" python3 -m bench.parallel_tests --processes 12 --timeout 150 tests/test_fp8.py -k transposed \
  > /tmp/tests_$variant.log 2>&1
timed=(main)
variant_tests_passed "$variant" && timed+=("$variant")
echo "tested at $SECONDS s"

for tree in "${timed[@]}"; do
  time_left 60 || break
  in_snap_tree "$tree" env DDTREE_SM90_FP8_KERNEL=transposed timeout 150 python3 -m bench.paged_fp8 "$cases" sm90 \
    --steps 2>&1 | grep -v DEBUG > "$OUT/steps_$tree.txt"
  echo "== $tree"; cat "$OUT/steps_$tree.txt"
done
echo "steps at $SECONDS s"

for tree in main "$clock_variant"; do
  for shape in ${WAIT_CASES:-H16_n1_B32_P8192 H16_n4_B8_P8192}; do
    time_left 40 || break 2
    echo "== $tree $shape --fp8 (auto splits)"
    in_clock_tree "$tree" env DDTREE_SM90_FP8_KERNEL=transposed timeout 60 python3 -m bench.profile_case "$shape" \
      --backend sm90 --fp8 --iters 2 2>&1 | grep -E "^wait_clocks"
  done
done > "$OUT/timeline.txt"
grep -E "^==|q (issued|landed|ready):|first pair:|stored:" "$OUT/timeline.txt"
echo "timelines at $SECONDS s"

[ ${#timed[@]} -gt 1 ] && time_left 60 && in_snap_tree "$variant" timeout 90 python3 -m bench.paged_fp8 --per-layer \
  H16_n1_B32_P8192 sm90 transposed 2>&1 | grep -v DEBUG > "$OUT/per_layer.txt"
cat "$OUT/per_layer.txt" 2>/dev/null
echo "done at $SECONDS s"
