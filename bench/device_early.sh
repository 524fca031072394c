#!/usr/bin/env bash
# The sm90 split kernel's early start (cutlass_kernels/sm90/early_schedule.cuh) in one device call:
# builds this tree; runs the GPU tests that cover it (TESTS, bench.parallel_tests); times the grid
# with the whole step started early (step[sm90]) and waiting for the preparation
# (step_waiting[sm90], DDTREE_EARLY_START=0 while captured), the two in turns in one process,
# FlashMLA and the attention alone beside (bench.verify --waiting-step).
#   run(command="bash bench/device_early.sh", carry=[".whl"])
# Writes $OUT/early.tgz (build and test logs, grid_early.json) and $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
R=/tmp/early; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc PYTHONUNBUFFERED=1 DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
timeout 300 python3 -c 'import ddtree_op.build as b; b.load_library("prep"); b.load_library("sm90")' > $R/build.log 2>&1
echo "built at $SECONDS s: exit $?" | tee -a $R/summary.txt
tests=${TESTS:-tests/test_gpu_early_start.py tests/test_bounds_safety.py tests/test_gpu_dependent_launch.py \
  tests/test_gpu_graphs.py tests/test_gpu_sm90.py tests/test_gpu_determinism.py tests/test_opcheck.py tests/test_compile.py}
python3 -m bench.parallel_tests --processes ${PROCESSES:-12} --timeout ${TEST_S:-170} --log-dir /tmp/tests $tests > $R/gpu_tests.log 2>&1
echo "tests at $SECONDS s: $(tail -n 1 $R/gpu_tests.log)" | tee -a $R/summary.txt
grep -h -E "^(FAILED|ERROR)" /tmp/tests/*.log 2>/dev/null | head -n 30 | tee -a $R/summary.txt
timeout ${GRID_S:-230} python3 -m bench.verify --cases ${CASES:-grid} --backends sm90,flashmla --waiting-step --out /tmp/r_early 2>&1 \
  | grep --line-buffered -E "^NVIDIA|wrote"
cp /tmp/r_early/results.json $R/grid_early.json 2>/dev/null; echo "grid at $SECONDS s" | tee -a $R/summary.txt
python3 -m bench.step_variants /tmp/r_early/results.json step_waiting 2>&1 | tee -a $R/summary.txt
[ -d /tmp/tests ] && tar czf $R/test_logs.tgz -C /tmp tests
cp $R/summary.txt $OUT/; tar czf $OUT/early.tgz -C $R .
echo "done at $SECONDS s"
