# Shared by the device scripts (sourced, not run).

# Appends variant TREE's test log (/tmp/tests_TREE.log: pytest's, or bench/parallel_tests.py's) to
# $OUT/tests.log; succeeds if its tests passed, else says that the variant is not timed.
variant_tests_passed() {
  local tree=$1 summary
  { echo "== $tree"; grep -v DEBUG "/tmp/tests_$tree.log" | tail -n 4; } >> "$OUT/tests.log"
  summary=$(grep -v DEBUG "/tmp/tests_$tree.log" | tail -n 1)
  summary=${summary#total: }  # parallel_tests' last line
  grep -q "CUT BY THE TIMEOUT" "/tmp/tests_$tree.log" && summary="cut: $summary"
  [[ "$summary" =~ ^[0-9]+\ passed && "$summary" != *failed* && "$summary" != *error* ]] && return 0
  echo "$tree: tests failed or timed out, not timed"
  return 1
}

# Runs COMMAND... in the snapshot .snap/TREE of the tree at $root (bench/snapshot_trees.sh), with
# that tree on PYTHONPATH after the carried wheels (/tmp/site) and a build cache of its own.
in_snap_tree() {
  local tree=$1; shift
  (cd "$root/.snap/$tree" && PYTHONPATH=/tmp/site:$root/.snap/$tree DDTREE_CACHE_DIR=/tmp/ddc_$tree "$@")
}

# in_snap_tree with the wait-clock build (-DDDTREE_WAIT_CLOCKS, wait_clocks.cuh). The flags are part
# of the build key, so the plain and the wait-clock builds share the tree's cache directory.
in_clock_tree() {
  (export DDTREE_NVCC_EXTRA=-DDDTREE_WAIT_CLOCKS; in_snap_tree "$@")
}

# TREE's wait clocks and pair timeline of CTA 0 (wait_clocks.cuh) on one shape: the wait-clock
# build's bench.profile_case with PROFILE_ARGS (--backend ..., --fp8), within SECONDS.
print_wait_clocks() {  # TREE SECONDS SHAPE PROFILE_ARGS...
  local tree=$1 seconds=$2 shape=$3; shift 3
  in_clock_tree "$tree" timeout "$seconds" python3 -m bench.profile_case "$shape" "$@" --iters 1 2>&1 \
    | grep -E "^(wait_clocks|trace) cta0"
}

# A device script's start, from the repository root: the wheels carried in .whl (the CUTLASS
# headers; sgl-flash-mla, the yardstick) into /tmp/site, which in_snap_tree puts on PYTHONPATH, and
# Python's output unbuffered (a script cut by its time limit keeps what it printed). Says so and
# fails where pip fails.
start_device_run() {
  export PYTHONUNBUFFERED=1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 ||
    { echo "the carried wheels (.whl/) did not install into /tmp/site" >&2; return 1; }
}
