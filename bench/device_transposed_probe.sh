#!/usr/bin/env bash
# The transposed FP8 pair-loop probe (bench/transposed_fp8_probe.py) in one device call, alone or
# before an A/B of kernel variants (bench/device_ab.sh) that shares the call's start and builds:
#   run(command="bash bench/device_transposed_probe.sh", carry=[".whl"])
#   run(command="AB_TREES='main NAME' [device_ab.sh's settings] bash bench/device_transposed_probe.sh",
#       carry=[".whl", ".snap"])
# With AB_TREES the probe runs in the first tree's snapshot (which must hold the probe), and every
# tree's libraries are built beside the probe's extension before either runs.
# PROBE_VARIANTS: the probe's builds (default bf16; bench/transposed_fp8_probe.py's VARIANTS), built
# at once. PROBE_ARGS: its other arguments (--shapes, --splits). PROBE_NCU_SHAPE: a shape to profile
# each variant on with ncu (compute workload, instruction and warp-state sections). PROBE_NO_PACKAGE=1:
# the probe alone (no package libraries built or timed); PROBE_ROWS=16: that N's kernel alone.
# Writes under $OUT: probe.txt, probe_build.log, census.txt (each variant's SASS opcodes at N = 16
# and 64), ncu.txt with PROBE_NCU_SHAPE (and, with AB_TREES, the A/B's files).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_probe .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
if [ -n "${AB_TREES:-}" ]; then
  tree=${AB_TREES%% *}
  tree_dir=$root/.snap/$tree cache=/tmp/ddc_$tree
else
  tree_dir=$root cache=/tmp/ddc_probe
fi
export TORCH_EXTENSIONS_DIR=/tmp/probe_ext
in_probe_tree() { (cd "$tree_dir" && PYTHONPATH=/tmp/site_probe:$tree_dir DDTREE_CACHE_DIR=$cache "$@"); }
variants=${PROBE_VARIANTS:-bf16}
# The probe's extensions and every tree's libraries at once (the A/B then finds its builds).
for v in ${variants//,/ }; do
  in_probe_tree timeout 400 python3 -c "from bench.transposed_fp8_probe import load_probe; load_probe('$v')" > "/tmp/probe_build_$v.log" 2>&1 &
done
if [ -n "${AB_TREES:-}" ]; then
  for t in $AB_TREES; do
    (cd "$root/.snap/$t" && PYTHONPATH=/tmp/site_probe:$root/.snap/$t DDTREE_CACHE_DIR=/tmp/ddc_$t timeout 400 \
      python3 bench/build_libraries.py) > "/tmp/build_$t.log" 2>&1 &
  done
elif [ -z "${PROBE_NO_PACKAGE:-}" ]; then
  in_probe_tree timeout 400 python3 bench/build_libraries.py > /tmp/build_probe.log 2>&1 &
fi
wait
grep -hv DEBUG /tmp/probe_build_*.log /tmp/build_*.log | tail -n 30 > "$OUT/probe_build.log"
echo "probe built at $SECONDS s"
# The probe first, then the A/B: a call that ends early keeps the shorter one's result.
# shellcheck disable=SC2086  # PROBE_ARGS: arguments, split at spaces
in_probe_tree timeout "${PROBE_TIMEOUT:-180}" python3 -m bench.transposed_fp8_probe --variants "$variants" ${PROBE_NO_PACKAGE:+--no-package} ${PROBE_ARGS:-} 2>&1 | grep -v DEBUG | tee "$OUT/probe.txt"
echo "probed at $SECONDS s"
for v in ${variants//,/ }; do
  for n in 16 64; do
    echo "== $v N=$n"
    in_probe_tree python3 -m bench.sass_census "$TORCH_EXTENSIONS_DIR/transposed_fp8_pair_$v/transposed_fp8_pair_$v.so" "ILi${n}E" 2>&1
  done
done > "$OUT/census.txt"
if [ -n "${PROBE_NCU_SHAPE:-}" ]; then
  for v in ${variants//,/ }; do
    echo "== $v $PROBE_NCU_SHAPE"
    in_probe_tree timeout 90 ncu --clock-control none -k regex:transposed_pair_kernel -c 1 --section ComputeWorkloadAnalysis \
      --section InstructionStats --section WarpStateStats --metrics 'regex:^sm__(inst_executed_pipe|pipe)_.*(pct_of_peak_sustained_active)$' \
      python3 -m bench.transposed_fp8_probe --variants "$v" --shapes "$PROBE_NCU_SHAPE" ${PROBE_NO_PACKAGE:+--no-package} 2>&1 | grep -v DEBUG
  done > "$OUT/ncu.txt"
  echo "profiled at $SECONDS s"
fi
if [ -n "${AB_TREES:-}" ]; then
  # shellcheck disable=SC2086  # AB_TREES: tree names, split at spaces
  bash bench/device_ab.sh $AB_TREES
fi
