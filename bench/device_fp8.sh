#!/usr/bin/env bash
# The FP8 (e4m3) cache on the H200 in one device call: builds this tree's libraries, runs the FP8
# GPU tests and the sm90 ones (${FP8_TESTS}, in ${PROCESSES:-8} processes), then times the whole step
# in the four layouts (bench/paged_fp8.py: slot and paged, bf16 and FP8; FP8 with each sm90 kernel of
# ${FP8_KERNELS:-transposed,widened}) for each backend of
# ${FP8_BACKENDS:-sm90} on ${FP8_CASES} (default: memory- and compute-bound shapes).
#   run(command="bash bench/device_fp8.sh", carry=[".whl"])
# SANITIZE=1: compute-sanitizer memcheck and racecheck on the sm90 FP8 kernels; GRID_S=0: no timing.
# Writes under $OUT: build.log, tests.log (and test_logs/), sanitizers.log, steps.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/device_common.sh
start_device_run || exit 1
export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_fp8
timeout "${BUILD_TIMEOUT:-400}" python3 bench/build_libraries.py > "$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
echo "built at $SECONDS s"
timeout $(( ${TEST_S:-240} + 40 )) python3 -m bench.parallel_tests --processes "${PROCESSES:-8}" --timeout "${TEST_S:-240}" \
  --log-dir "$OUT/test_logs" ${FP8_TESTS:-tests/test_fp8.py tests/test_paged.py tests/test_gpu_sm90.py tests/test_gpu_persistent.py} \
  > "$OUT/tests.log" 2>&1
tail -n 4 "$OUT/tests.log"
grep -hE "^(FAILED|ERROR)" "$OUT"/test_logs/* 2>/dev/null | head -n 20
echo "tested at $SECONDS s"
if [ "${SANITIZE:-0}" = 1 ]; then  # memcheck, then racecheck, on the sm90 FP8 kernels in all four schedules
  for tool in memcheck racecheck; do
    timeout "${SANITIZE_S:-60}" compute-sanitizer --tool $tool --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
      tests/test_fp8.py -k "sm90_schedules and 4000" 2>&1 | grep -v DEBUG | tail -n 12
  done | tee "$OUT/sanitizers.log"
  echo "sanitized at $SECONDS s"
fi
[ "${GRID_S:-200}" = 0 ] && exit 0
cases=${FP8_CASES:-H16_n4_B8_P8192,H16_n4_B32_P8192,H16_n4_B32_P1024,dsv3_H16_chain4_B64_P4k,H16_n16_B32_P8192,H128_n4_B32_P8192,H128_n64_B8_P8192}
for backend in ${FP8_BACKENDS:-sm90}; do
  echo "== $backend"
  timeout "${GRID_S:-200}" python3 -m bench.paged_fp8 "$cases" "$backend" "${FP8_KERNELS:-transposed,widened}" 2>&1 | grep -v DEBUG
done | tee "$OUT/steps.txt"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$OUT/steps.txt"
