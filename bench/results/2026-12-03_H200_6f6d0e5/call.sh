# Seventh session, call 4 (the budget's last ~4 minutes): roperel (6f6d0e5, stage 1's rope chunk
# released right after S1) against main (edf0f83): its sm90 tests, then attention alone on eight
# grid shapes, main, roperel, main again.
set -uo pipefail
root=$PWD
source bench/device_common.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1
for t in main roperel; do in_snap_tree $t timeout 150 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"
in_snap_tree roperel timeout 60 python3 -m pytest -x -q -p no:cacheprovider tests/test_gpu_sm90.py tests/test_gpu_determinism.py -k sm90 > /tmp/tests_roperel.log 2>&1
variant_tests_passed roperel || exit 0
echo "tested at $SECONDS s"
shapes='H16_n4_B1_P1024$,H128_n64_B1_P1024$,H16_n16_B32_P8192$,H16_n64_B32_P8192$,H128_n4_B32_P8192$,H128_n16_B8_P8192$,H128_n16_B32_P8192$,H128_n64_B8_P8192$'
specs=()
for run in main roperel main2; do t=${run%2}
  in_snap_tree $t timeout 40 python3 -m bench.verify --cases grid --filter "$shapes" --no-prep --backends sm90 --out /tmp/r_$run 2>&1 | grep -E "wrote"
  cp /tmp/r_$run/results.json $OUT/ab_$run.json && specs+=("$run=$OUT/ab_$run.json"); echo "$run at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs "${specs[@]}" --columns sm90 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt
