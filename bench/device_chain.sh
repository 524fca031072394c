#!/usr/bin/env bash
# The step's launch chain (cutlass_kernels/grid_dependency.cuh) in one device call: builds this
# tree and the kernel variants under .snap/ (bench/snapshot_trees.sh) in parallel; runs this
# tree's GPU tests of the chain (TESTS; bench.parallel_tests) beside the variants' sm90 tests;
# times the whole step on the grid with its kernels chained and plain (bench.verify --plain-step,
# the two in turns in one process, FlashMLA beside); then, while time is left (before
# AB_DEADLINE_S), attention alone for each variant (sm90 and FlashMLA, bench.compare_runs).
#   run(command="bash bench/device_chain.sh main v16a", carry=[".whl", ".snap"])
# Writes $OUT/chain.tgz: gpu_tests.log, grid_chain.json, grid_<tree>.json, ab.txt, build and test logs.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD R=/tmp/chain; mkdir -p $R
source bench/device_common.sh
start_device_run || exit 1
export DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
(PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=/tmp/ddc timeout 240 python3 "$root/bench/build_libraries.py" > $R/build.log 2>&1) &
for tree in "$@"; do in_snap_tree "$tree" timeout 240 python3 "$root/bench/build_libraries.py" > "$R/build_$tree.log" 2>&1 & done
wait
for f in $R/build*.log; do echo "== $f"; grep -v DEBUG "$f" | tail -n 2; done; echo "built at $SECONDS s"
export PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=/tmp/ddc
tests=${TESTS:-tests/test_gpu_dependent_launch.py tests/test_gpu_graphs.py tests/test_gpu_sm90.py tests/test_gpu_persistent.py \
  tests/test_gpu_attention.py tests/test_paged.py tests/test_gpu_backends.py}
python3 -m bench.parallel_tests --processes ${PROCESSES:-10} --timeout ${TEST_S:-150} --log-dir /tmp/tests $tests > $R/gpu_tests.log 2>&1 &
for tree in "$@"; do
  [ "$tree" = main ] && continue
  in_snap_tree "$tree" timeout "${TEST_S:-150}" python3 -m pytest -x -q -p no:cacheprovider tests/test_gpu_sm90.py \
    tests/test_gpu_attention.py tests/test_gpu_persistent.py -k sm90 > "/tmp/tests_$tree.log" 2>&1 &
done
wait
echo "tests at $SECONDS s"; tail -n 3 $R/gpu_tests.log
timeout ${GRID_S:-220} python3 -m bench.verify --cases grid --backends sm90,flashmla --plain-step --out /tmp/r_chain 2>&1 \
  | grep --line-buffered -E "^NVIDIA|wrote"
cp /tmp/r_chain/results.json $R/grid_chain.json 2>/dev/null; echo "chain grid at $SECONDS s"
python3 -m bench.step_variants /tmp/r_chain/results.json step_plain --small-floor 5 2>&1 | tee $R/chain_summary.txt
specs=()
for tree in "$@"; do
  [ "$tree" = main ] || variant_tests_passed "$tree" || continue
  [ "$SECONDS" -lt "${AB_DEADLINE_S:-480}" ] || { echo "$tree not timed: past the deadline"; continue; }
  in_snap_tree "$tree" timeout 100 python3 -m bench.verify --cases grid --no-prep --backends sm90,flashmla --out "/tmp/r_$tree" 2>&1 \
    | grep --line-buffered -E "wrote"
  cp "/tmp/r_$tree/results.json" "$R/grid_$tree.json" && specs+=("$tree=$R/grid_$tree.json")
  echo "$tree timed at $SECONDS s"
done
[ ${#specs[@]} -ge 2 ] && python3 -m bench.compare_runs "${specs[@]}" > $R/ab.txt 2>&1 && grep -E "^sm90" $R/ab.txt
[ -f "$OUT/tests.log" ] && cp "$OUT/tests.log" $R/variant_tests.log
[ -d /tmp/tests ] && tar czf $R/test_logs.tgz -C /tmp tests
tar czf $OUT/chain.tgz -C $R .
echo "done at $SECONDS s"
