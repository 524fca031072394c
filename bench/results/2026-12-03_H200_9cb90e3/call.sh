# Sixth session, call 5: merge2 (the working tree: the persistent kernel's merge with two slots'
# loads in flight and the first two weights kept) against main (2d47356, .snap/main): its GPU
# tests, attention alone on the four ragged persistent pairs as main, merge2, main again, split
# against persistent on H128_n4_B8_P8192 and its ragged twin in merge2; then the smallplan puzzle
# with DDTREE_PDL=0 (the step's kernels one after another) in main and .snap/smallplan.
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
in_tree() { local t=$1; shift; local d=$root; [ "$t" = merge2 ] || d=$root/.snap/$t
  (cd $d && PYTHONPATH=/tmp/site:$d DDTREE_CACHE_DIR=/tmp/ddc_$t "$@"); }
for t in main merge2 smallplan; do in_tree $t timeout 200 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"; for t in main merge2 smallplan; do tail -n 1 /tmp/build_$t.log; done
in_tree merge2 timeout 150 python3 -m bench.parallel_tests --processes 14 --timeout 110 --log-dir /tmp/tests_merge2 \
  tests/test_gpu_persistent.py tests/test_gpu_determinism.py tests/test_prepared.py > $OUT/tests_merge2.log 2>&1
echo "merge2 tests rc $? at $SECONDS s"; tail -n 2 $OUT/tests_merge2.log
shapes=H16_n16_B32_P8192\$,H16_n16_B32_P8192_ragged,H16_n64_B8_P8192\$,H16_n64_B8_P8192_ragged,H128_n4_B32_P8192\$,H128_n4_B32_P8192_ragged,H128_n16_B8_P8192\$,H128_n16_B8_P8192_ragged
for run in main merge2 main2; do t=${run%2}; [ "$run" = merge2 ] && t=merge2
  in_tree $t timeout 80 python3 -m bench.verify --cases all --filter "$shapes" --no-prep --backends sm90 --out /tmp/r_$run 2>&1 | grep -E "wrote"
  cp /tmp/r_$run/results.json $OUT/ab_$run.json; echo "$run at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/ab_main.json merge2=$OUT/ab_merge2.json main2=$OUT/ab_main2.json --columns sm90 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt
in_tree merge2 timeout 60 python3 $root/bench/time_schedules.py H128_n4_B8_P8192,H128_n4_B8_P8192_ragged 2>&1 | grep -v -i warn | tee $OUT/schedules.log
{ for t in main smallplan; do echo "== $t H16_n4_B32_P1024 DDTREE_PDL=0"; in_tree $t env DDTREE_PDL=0 timeout 40 python3 -m bench.profile_case H16_n4_B32_P1024 --kernels --step 2>&1 | grep -v -i warn; done; } > $OUT/kernels_nopdl.log 2>&1
cat $OUT/kernels_nopdl.log; echo "done at $SECONDS s"
