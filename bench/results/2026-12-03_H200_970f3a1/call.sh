# Seventh session, call 2: fmorder (970f3a1: FlashMLA's order of the seesaw's second half, P1 in
# its own tile) and fmorder_b (its warpgroup 0 releasing stage 0's first half before it waits for
# scale1) against main (fa5b666): their sm90 tests side by side, attention alone on the grid
# (main with paged:sm90 and FlashMLA beside, fmorder with paged:sm90, fmorder_b sm90 only), then
# fmorder's wait clocks on the compute-bound and the tiny shape.
set -uo pipefail
root=$PWD
source bench/device_common.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1
in_tree() { local t=$1 suffix=$2 extra=$3; shift 3
  (cd $root/.snap/$t && PYTHONPATH=/tmp/site:$root/.snap/$t DDTREE_CACHE_DIR=/tmp/ddc_$t$suffix DDTREE_NVCC_EXTRA="$extra" "$@"); }
for t in main fmorder fmorder_b; do in_tree $t "" "" timeout 300 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
in_tree fmorder _wc -DDDTREE_WAIT_CLOCKS timeout 300 python3 $root/bench/build_libraries.py > /tmp/build_fmorder_wc.log 2>&1 &
wait; echo "built at $SECONDS s"; for f in /tmp/build_*.log; do echo "$f: $(grep -v DEBUG $f | tail -n 1)"; done
for t in fmorder fmorder_b; do
  in_tree $t "" "" timeout 150 python3 -m pytest -x -q -p no:cacheprovider tests/test_gpu_sm90.py tests/test_gpu_attention.py \
    tests/test_gpu_persistent.py tests/test_paged.py tests/test_gpu_determinism.py -k sm90 > /tmp/tests_$t.log 2>&1 &
done
wait; echo "tested at $SECONDS s"
timed=(main); for t in fmorder fmorder_b; do variant_tests_passed $t && timed+=($t); done
specs=()
for t in "${timed[@]}"; do
  case $t in main) b=sm90,paged:sm90,flashmla;; fmorder) b=sm90,paged:sm90;; *) b=sm90;; esac
  in_tree $t "" "" timeout 150 python3 -m bench.verify --cases grid --no-prep --backends $b --out /tmp/r_$t 2>&1 | grep -E "^NVIDIA|wrote"
  cp /tmp/r_$t/results.json $OUT/grid_$t.json && specs+=("$t=$OUT/grid_$t.json"); echo "$t timed at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs "${specs[@]}" --columns sm90,paged:sm90 > $OUT/ab.txt 2>&1
grep -E "^sm90|^paged" $OUT/ab.txt
for c in "H128_n64_B8_P8192 sm90" "H128_n64_B8_P8192 paged:sm90" "H16_n4_B1_P1024 sm90"; do read -r shape backend <<< "$c"
  echo "== fmorder $shape $backend"; in_tree fmorder _wc -DDDTREE_WAIT_CLOCKS timeout 40 python3 -m bench.profile_case $shape --backend $backend --iters 1 2>&1 | grep wait_clocks
done > $OUT/wait_clocks.log; cat $OUT/wait_clocks.log
echo "done at $SECONDS s"
