# Seventh session, call 3: the landing run of main (fmorder merged: the whole GPU suite, racecheck,
# the 66 shapes with FlashMLA and paged:sm90 beside, per layer and the step), with two prepared
# variants on top of it measured after: gorder (the gather refills stage 1's second half first)
# and bulkepi (the epilogue's rows as bulk copies). Their sm90 tests run beside the suite; their
# attention alone on the grid (sm90, --no-prep) after the landing, beside main's, while time lasts.
set -uo pipefail
root=$PWD
source bench/device_common.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1
(PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=/tmp/ddc timeout 300 python3 bench/build_libraries.py > /tmp/build_main.log 2>&1) &
for t in gorder bulkepi; do in_snap_tree $t timeout 300 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"
for t in gorder bulkepi; do
  in_snap_tree $t timeout 200 python3 -m pytest -x -q -p no:cacheprovider tests/test_gpu_sm90.py tests/test_gpu_attention.py \
    tests/test_gpu_persistent.py tests/test_paged.py tests/test_gpu_determinism.py -k sm90 > /tmp/tests_$t.log 2>&1 &
done
TESTS=tests RACECHECK=1 COSTS=0 PROCESSES=12 TEST_S=300 GRID_CASES=all GRID_BACKENDS=sm90,flashmla,paged:sm90 GRID_S=240 \
  bash bench/device_landing.sh
echo "landing done at $SECONDS s"
wait
timed=(); for t in gorder bulkepi; do variant_tests_passed $t && timed+=($t); done
specs=()
for t in main "${timed[@]}"; do
  [ $SECONDS -lt 530 ] || { echo "no time left for $t"; break; }
  if [ $t = main ]; then
    PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=/tmp/ddc timeout 60 python3 -m bench.verify --cases grid --no-prep --backends sm90 --out /tmp/r_main 2>&1 | grep -E "wrote"
  else
    in_snap_tree $t timeout 60 python3 -m bench.verify --cases grid --no-prep --backends sm90 --out /tmp/r_$t 2>&1 | grep -E "wrote"
  fi
  cp /tmp/r_$t/results.json $OUT/grid_$t.json && specs+=("$t=$OUT/grid_$t.json"); echo "$t timed at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs "${specs[@]}" --columns sm90 > $OUT/ab.txt 2>&1; grep -E "^sm90" $OUT/ab.txt
echo "done at $SECONDS s"
