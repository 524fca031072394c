#!/usr/bin/env bash
# Preparation variants A/B in one device call: the working tree (named main) and trees under
# .snap/ (bench/snapshot_trees.sh). Builds every tree's CUDA libraries in parallel, runs each
# variant's preparation GPU tests side by side (those named in UNTESTED, e.g. a tree older than
# the tests, are not tested; a failing variant is not timed), then times the
# preparation launch alone (bench.time_prepare) for each tree, one after another. A tree older than
# Every tree gets this tree's bench/time_prepare.py (it times any version's preparation);
# PREP_ARGS are its arguments (default: CASES, or grid), e.g. "--plan --batches 8,32,256".
#   run(command="UNTESTED=old bash bench/device_prep_ab.sh prepmask old", carry=[".whl", ".snap"])
# Writes under $OUT: prep_<tree>.log, tests.log, build.log, prepare_ab.txt (a table of µs per case).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source bench/device_common.sh
start_device_run || exit 1
tree_dir() { [ "$1" = main ] && echo "$root" || echo "$root/.snap/$1"; }
in_tree() {  # TREE COMMAND...: the command in that tree with its own build cache
  local tree=$1; shift
  (cd "$(tree_dir "$tree")" && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_$tree "$@")
}
trees=(main "$@")
for tree in "$@"; do
  cp bench/time_prepare.py "$(tree_dir "$tree")/bench/"
done
untested=" ${UNTESTED:-} "
# A tested tree's sm90 library too: the preparation tests run whole verify steps.
for tree in "${trees[@]}"; do
  build='import ddtree_op.build as b; b.load_library("prep")'
  [[ "$tree" == main || "$untested" == *" $tree "* ]] || build="$build; b.load_library(\"sm90\")"
  in_tree "$tree" timeout "${BUILD_TIMEOUT:-300}" python3 -c "$build" > "/tmp/build_$tree.log" 2>&1 &
done
wait
for tree in "${trees[@]}"; do echo "== $tree"; grep -v DEBUG "/tmp/build_$tree.log" | tail -n 2; done > "$OUT/build.log"
echo "built at $SECONDS s"
tests=(tests/test_gpu_prep.py tests/test_bounds_safety.py tests/test_bounds_args.py)
# In TEST_PROCESSES processes a tree (one took over 240 s on an H100), cut at TEST_TIMEOUT.
test_timeout=${TEST_TIMEOUT:-240}
for tree in "$@"; do
  [[ "$untested" == *" $tree "* ]] && continue
  in_tree "$tree" timeout "$test_timeout" python3 "$root/bench/parallel_tests.py" --processes "${TEST_PROCESSES:-6}" \
    --timeout $((test_timeout - 40)) "${tests[@]}" > "/tmp/tests_$tree.log" 2>&1 &
done
wait
timed=(main)
for tree in "$@"; do
  if [ ! -f "/tmp/tests_$tree.log" ]; then timed+=("$tree"); continue; fi
  variant_tests_passed "$tree" && timed+=("$tree")
done
echo "tested at $SECONDS s"
for tree in "${timed[@]}"; do
  in_tree "$tree" timeout "${TIME_TIMEOUT:-90}" python3 -m bench.time_prepare ${PREP_ARGS:-"${CASES:-grid}"} > "$OUT/prep_$tree.log" 2>&1
  echo "$tree: $(tail -n 1 "$OUT/prep_$tree.log") at $SECONDS s"
done
# One row per case, one column per tree (µs).
python3 - "${timed[@]}" > "$OUT/prepare_ab.txt" <<'EOF'
import math, os, sys
trees = sys.argv[1:]
times = {t: {line.split()[0]: line.split()[2] for line in open(os.path.join(os.environ["OUT"], f"prep_{t}.log"))
             if len(line.split()) >= 3 and line.split()[1] == "prepare"} for t in trees}
print(f"{'case':22s}" + "".join(f"{t:>10s}" for t in trees))
for case in times[trees[0]]:
    print(f"{case:22s}" + "".join(f"{times[t].get(case, '-'):>10s}" for t in trees))
cases = [c for c in times[trees[0]] if all(c in times[t] for t in trees)]  # a cut run has fewer
geomeans = [math.exp(sum(math.log(float(times[t][c])) for c in cases) / len(cases)) if cases else float("nan") for t in trees]
print(f"{f'geomean ({len(cases)})':22s}" + "".join(f"{g:>10.2f}" for g in geomeans))
EOF
cat "$OUT/prepare_ab.txt" | tail -n 3
