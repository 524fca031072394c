# Session 31, call 1: qbulk's timeline, the FP8/bf16 step breakdown, the N=64 rule A/B, then the GPU files.
set -uo pipefail
root=$PWD
source bench/device_common.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > $OUT/smi.txt
in_snap_tree main timeout 400 python3 $root/bench/build_libraries.py > $OUT/build_main.log 2>&1 &
CLOCK_ITERS=2 PLAN_CASES= SPLITS="0 1" WAIT_CASES="H16_n1_B32_P8192" bash bench/device_clocks.sh main > $OUT/clocks.out 2>&1
wait
echo "clocks done at $SECONDS s"
{
  for c in H16_n1_B32_P8192 H16_n4_B8_P8192; do
    echo "== $c fp8 step kernels (auto)"; in_snap_tree main timeout 60 python3 -m bench.profile_case $c --fp8 --kernels 2>&1 | grep -v DEBUG
    echo "== $c bf16 step kernels"; in_snap_tree main timeout 60 python3 -m bench.profile_case $c --step --kernels 2>&1 | grep -v DEBUG
  done
} > $OUT/breakdown.txt
echo "breakdown done at $SECONDS s"
in_snap_tree main timeout 150 python3 -m bench.paged_fp8 H16_n1_B32_P8192,H16_n4_B8_P8192,H16_n4_B32_P1024,H128_n4_B8_P8192 sm90 transposed,widened 2>&1 | grep -v DEBUG > $OUT/fp8_rule.txt
echo "rule done at $SECONDS s"
left=$(( 560 - SECONDS - 40 ))
in_snap_tree main python3 -m bench.parallel_tests --processes 12 --timeout $left --log-dir $OUT/testlogs tests/test_fp8.py tests/test_paged.py tests/test_gpu_sm90.py > $OUT/tests.log 2>&1
echo "tests done at $SECONDS s"; tail -n 16 $OUT/tests.log
