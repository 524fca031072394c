#!/usr/bin/env bash
# One device call per stage, to validate a commit on the H200 within the device budget.
#   run(command="bash bench/device_check.sh STAGE", carry=[".whl"])   (.whl/ holds the nvidia-cutlass wheel)
# Stages: iterate2  - (kind nvidia-h200-x2) a kernel change: every GPU test on GPU 1 while GPU 0 times the
#                     grid, the tiny shape's kernels and one ncu profile; then the two-GPU test
#         finish2   - (kind nvidia-h200-x2) the whole benchmark on GPU 0 while GPU 1 runs the sanitizers
#         change2   - (kind nvidia-h200-x2) after a change: GPU 1 runs every GPU test, memcheck (sm90, or
#                     $SANITIZE_BACKEND), racecheck and the wait clocks of a debug build (sm90/wait_clocks.cuh); GPU 0 the whole
#                     benchmark and the tiny shape's kernels; then the two-GPU test
#         close     - every GPU test, racecheck (sm90, 150 s), memcheck (Triton)
#         final     - (kind nvidia-h200-x2) second GPU, racecheck, tiny-shape kernel times, benchmark
#         validate  - every GPU test, install + JIT check, sanitizers, per-kernel times (tiny shape)
#         iterate   - after a kernel change: sm90 correctness, sm90 grid timings, ncu on two shapes
#         first     - sm90, then the grid timed for sm90 and Triton (no baseline, no prep)
#         sm90      - the sm_90a kernel against the reference (focused, stops at the first failure)
#         tests     - every GPU test (both CUDA backends when the sm90 kernel is enabled)
#         sanitize  - compute-sanitizer memcheck and racecheck on a few shapes, both backends
#         bench     - the benchmark (grid, ragged, serving) with every available backend
# Writes logs under $OUT (at most 8 files come back).
set -uo pipefail
stage=${1:?stage: change2 | iterate2 | finish2 | close | final | validate | iterate | first | sm90 | tests | sanitize | bench}
source bench/device_common.sh
start_device_run || exit 1
export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc
commit=${DDTREE_COMMIT:-unknown}
if [ "$stage" = finish2 ] || [ "$stage" = change2 ]; then nvidia-smi -L; else nvidia-smi -L > "$OUT/env.log" 2>&1; fi  # finish2 needs all 8 files

build_libraries() {  # JIT-build both CUDA libraries once, before processes on two GPUs want them
  python3 bench/build_libraries.py 2>&1 | grep -v DEBUG | tail -3
}

case "$stage" in
  change2)
    build_libraries
    ( DDTREE_NVCC_EXTRA=-DDDTREE_WAIT_CLOCKS build_libraries > /tmp/debug_build.log 2>&1 ) &
    ( export CUDA_VISIBLE_DEVICES=1
      timeout 330 python3 -m pytest -q -p no:cacheprovider --maxfail=5 tests -k "not cpu and not multi_gpu" 2>&1 | grep -v DEBUG \
        > "$OUT/gpu_tests.log"
      timeout 80 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
        tests/test_gpu_*.py -k "(H16-B3-n16-P9000 or H16-B3-n128-P8192) and full and ${SANITIZE_BACKEND:-sm90}" 2>&1 \
        | grep -v DEBUG >> "$OUT/sanitizers.log"
      for shape in H1-B3-n33-P64 H16-B3-n16-P9000; do
        timeout 90 compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
          tests/test_gpu_*.py -k "$shape and full and sm90" 2>&1 | grep -v DEBUG >> "$OUT/sanitizers.log"
      done
      for case in "H128_n64_B8_P8192 paged:sm90" "H128_n64_B8_P8192 sm90" "H16_n16_B32_P8192 sm90" "H16_n4_B1_P1024 sm90"; do
        set -- $case
        echo "== $1 $2 (one call; CTA (0, 0): cycles each role's first thread waited, by kind)"
        DDTREE_NVCC_EXTRA=-DDDTREE_WAIT_CLOCKS timeout 60 python3 -m bench.profile_case $1 --backend $2 --iters 1 2>&1 | grep -v Warn
      done > "$OUT/wait_clocks.log" 2>&1
    ) &
    export CUDA_VISIBLE_DEVICES=0
    DDTREE_COMMIT=$commit timeout 300 python3 -m bench.verify --cases all --backends sm90,triton,sglang_baseline \
      --out "$OUT/bench" 2>&1 | grep -v "^  " | tail -16
    timeout 30 python3 -m bench.profile_case H16_n4_B1_P1024 --kernels 2>&1 | grep -v Warn | tee "$OUT/kernels.log"
    wait; unset CUDA_VISIBLE_DEVICES
    timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py 2>&1 | grep -v DEBUG | tail -2 | tee -a "$OUT/gpu_tests.log"
    tail -4 "$OUT/gpu_tests.log"; grep -E "SUMMARY|passed|failed" "$OUT/sanitizers.log"; head -30 "$OUT/wait_clocks.log" ;;
  iterate2)
    build_libraries
    ( CUDA_VISIBLE_DEVICES=1 timeout 330 python3 -m pytest -q -p no:cacheprovider --maxfail=5 tests -k "not cpu and not multi_gpu" \
        2>&1 | grep -v DEBUG > "$OUT/gpu_tests.log" ) &
    export CUDA_VISIBLE_DEVICES=0
    DDTREE_COMMIT=$commit timeout 170 python3 -m bench.verify --cases grid --no-prep --backends sm90,triton \
      --out "$OUT/bench" 2>&1 | grep -v "^  " | tail -45
    timeout 30 python3 -m bench.profile_case H16_n4_B1_P1024 --kernels 2>&1 | grep -v Warn | tee "$OUT/kernels.log"
    timeout 80 ncu --clock-control none -k regex:verify_attention --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
      python3 -m bench.profile_case H128_n64_B8_P8192 > "$OUT/ncu_H128_n64_B8_P8192.txt" 2>&1
    grep -E "Duration|Throughput|Registers" "$OUT/ncu_H128_n64_B8_P8192.txt" | head -12
    wait; unset CUDA_VISIBLE_DEVICES; tail -6 "$OUT/gpu_tests.log"
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py 2>&1 | grep -v DEBUG \
      | tee "$OUT/multi_gpu.log" | tail -3 ;;
  finish2)
    build_libraries
    ( export CUDA_VISIBLE_DEVICES=1
      for shape in H1-B3-n33-P64 H16-B3-n16-P9000; do  # a small one that surely finishes, then one with many tiles
        timeout 150 compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
          tests/test_gpu_*.py -k "$shape and full and sm90" 2>&1 | grep -v DEBUG >> "$OUT/sanitizer_racecheck.log"
      done
      for backend in sm90 triton; do
        timeout 80 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
          tests/test_gpu_*.py -k "(H16-B3-n16-P9000 or H16-B3-n128-P8192) and full and $backend" 2>&1 | grep -v DEBUG \
          >> "$OUT/sanitizer_memcheck.log"
      done
      # Where a tiny shape's time goes: every ncu section, and per-SASS-line stall samples.
      for shape in H16_n4_B1_P1024 H16_n4_B1_P8192; do
        timeout 60 ncu --clock-control none --set full -k regex:verify_attention --launch-skip 1 --launch-count 1 \
          -f -o /tmp/ncu_$shape python3 -m bench.profile_case $shape > /dev/null 2>&1
        ncu -i /tmp/ncu_$shape.ncu-rep --print-details all >> "$OUT/ncu_tiny.txt" 2>&1
      done
      ncu -i /tmp/ncu_H16_n4_B1_P8192.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_tiny_source.csv" 2>&1
    ) &
    CUDA_VISIBLE_DEVICES=0 DDTREE_COMMIT=$commit timeout 450 python3 -m bench.verify --cases all \
      --backends sm90,triton,sglang_baseline --out "$OUT/bench" 2>&1 | grep -v "^  " | tail -14
    wait; grep -E "SUMMARY|passed|failed" "$OUT/sanitizer_racecheck.log"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer_memcheck.log" ;;
  sm90)
    timeout 500 python3 -m pytest -x -q -p no:cacheprovider tests/test_gpu_*.py -k "sm90" 2>&1 | grep -v DEBUG | tee "$OUT/sm90_tests.log" | tail -40 ;;
  first)  # sm90 correctness, then (only if it passed) first timings on the grid, sm90 vs Triton
    timeout 330 python3 -m pytest -x -q -p no:cacheprovider tests/test_gpu_*.py -k "sm90" 2>&1 | grep -v DEBUG \
      | tee "$OUT/sm90_tests.log" | tail -25
    [ "${PIPESTATUS[0]}" = 0 ] || exit 1
    DDTREE_COMMIT=$commit timeout 240 python3 -m bench.verify --cases grid --no-prep --backends sm90,triton \
      --out "$OUT/bench" 2>&1 | grep -v "^  " | tail -45 ;;
  iterate)  # a kernel change: sm90 correctness, grid timings of sm90 alone, ncu on two shapes
    timeout 200 python3 -m pytest -x -q -p no:cacheprovider tests/test_gpu_*.py -k "sm90" 2>&1 | grep -v DEBUG \
      | tee "$OUT/sm90_tests.log" | tail -6
    [ "${PIPESTATUS[0]}" = 0 ] || exit 1
    DDTREE_COMMIT=$commit timeout 200 python3 -m bench.verify --cases grid --no-prep --backends sm90,triton \
      --out "$OUT/bench" 2>&1 | grep -v "^  " | tail -45
    for shape in ${NCU_SHAPES:-H128_n64_B8_P8192 H16_n4_B32_P8192}; do
      timeout 90 ncu --clock-control none -k regex:verify_attention --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
        python3 -m bench.profile_case "$shape" > "$OUT/ncu_$shape.txt" 2>&1
      grep -E "Duration|Throughput|Stall|Warp Cycles|Registers" "$OUT/ncu_$shape.txt" | head -20
    done ;;
  validate)  # every GPU test; non-editable install + JIT; sanitizers; per-kernel times of a tiny shape
    timeout 290 python3 -m pytest -q -p no:cacheprovider tests -k "not cpu" 2>&1 | grep -v DEBUG \
      | tee "$OUT/gpu_tests.log" | tail -8
    bash bench/install_check.sh > "$OUT/install.log" 2>&1; tail -5 "$OUT/install.log"
    for tool in memcheck racecheck; do
      timeout 80 compute-sanitizer --tool "$tool" --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
        tests/test_gpu_*.py -k "(H16-B3-n16-P9000 or H16-B3-n128-P8192) and full and sm90" 2>&1 | grep -v DEBUG \
        | tee "$OUT/sanitizer_$tool.log" | tail -4
    done
    for backend in sm90 triton; do
      timeout 40 python3 -m bench.profile_case H16_n4_B1_P1024 --kernels --backend $backend 2>&1 | tee -a "$OUT/kernels.log"
    done ;;
  final)  # on nvidia-h200-x2: the second-GPU test, racecheck (small), tiny-shape kernel times, the benchmark
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py 2>&1 | grep -v DEBUG \
      | tee "$OUT/multi_gpu.log" | tail -3
    timeout 60 compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
      tests/test_gpu_*.py -k "H1-B3-n33-P64 and full and sm90" 2>&1 | grep -v DEBUG | tee "$OUT/sanitizer_racecheck.log" | tail -3
    for sets in 1 8; do
      timeout 30 python3 -m bench.profile_case H16_n4_B1_P1024 --kernels --sets $sets 2>&1 | grep -v Warn | tee -a "$OUT/kernels.log"
    done
    DDTREE_COMMIT=$commit timeout 400 python3 -m bench.verify --cases all --backends sm90,triton,sglang_baseline \
      --out "$OUT/bench" 2>&1 | grep -v "^  " | tail -12 ;;
  close)  # after CPU-only changes to a validated kernel: every GPU test, racecheck with time to finish, Triton memcheck
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests -k "not cpu" 2>&1 | grep -v DEBUG \
      | tee "$OUT/gpu_tests.log" | tail -8
    timeout 150 compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
      tests/test_gpu_*.py -k "H16-B3-n16-P9000 and full and sm90" 2>&1 | grep -v DEBUG | tee "$OUT/sanitizer_racecheck.log" | tail -3
    timeout 90 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
      tests/test_gpu_*.py -k "(H16-B3-n16-P9000 or H16-B3-n128-P8192) and full and triton" 2>&1 | grep -v DEBUG \
      | tee "$OUT/sanitizer_memcheck_triton.log" | tail -3 ;;
  tests)
    timeout 560 python3 -m pytest -q -p no:cacheprovider tests -k "not cpu" 2>&1 | grep -v DEBUG | tee "$OUT/gpu_tests.log" | tail -30 ;;
  sanitize)
    for tool in memcheck racecheck; do
      timeout 250 compute-sanitizer --tool "$tool" --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
        tests/test_gpu_*.py -k "(H16-B3-n16-P9000 or H128-B3-n128-P65536) and full" 2>&1 | grep -v DEBUG \
        | tee "$OUT/sanitizer_$tool.log" | tail -8
    done ;;
  bench)
    DDTREE_COMMIT=$commit timeout 560 python3 -m bench.verify --cases all --backends sm90,triton,sglang_baseline \
      --out "$OUT/bench" 2>&1 | grep -v "^  " | tail -20 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
