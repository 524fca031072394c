# Sixth session, call 1: merge (b8d7ffe, the persistent kernel merges its cut row blocks itself)
# against main (cda92b5, .snap/main): its GPU tests, then attention alone on the four ragged shapes
# where auto takes the persistent kernel and their uniform twins (main, merge, main again), the
# step's kernels one by one on the ragged shape; then the smallplan puzzle (the step's kernels
# one by one on two P1024 shapes in main and in smallplan, .snap/smallplan).
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
in_tree() { local t=$1; shift; local d=$root; [ "$t" = merge ] || d=$root/.snap/$t
  (cd $d && PYTHONPATH=/tmp/site:$d DDTREE_CACHE_DIR=/tmp/ddc_$t "$@"); }
for t in main merge smallplan; do in_tree $t timeout 200 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"; for t in main merge smallplan; do tail -n 1 /tmp/build_$t.log; done
in_tree merge timeout 190 python3 -m bench.parallel_tests --processes 14 --timeout 150 --log-dir /tmp/tests_merge \
  tests/test_gpu_persistent.py tests/test_gpu_determinism.py tests/test_prepared.py tests/test_gpu_sm90.py \
  tests/test_gpu_graphs.py tests/test_gpu_prep.py > $OUT/tests_merge.log 2>&1
echo "merge tests rc $? at $SECONDS s"; tail -n 3 $OUT/tests_merge.log
shapes=H16_n16_B32_P8192\$,H16_n16_B32_P8192_ragged,H16_n64_B8_P8192\$,H16_n64_B8_P8192_ragged,H128_n4_B32_P8192\$,H128_n4_B32_P8192_ragged,H128_n16_B8_P8192\$,H128_n16_B8_P8192_ragged
for run in main merge main2; do t=${run%2}
  in_tree $t timeout 80 python3 -m bench.verify --cases all --filter "$shapes" --no-prep --backends sm90,paged:sm90 --out /tmp/r_$run 2>&1 | grep -E "wrote"
  cp /tmp/r_$run/results.json $OUT/ab_$run.json; echo "$run at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/ab_main.json merge=$OUT/ab_merge.json main2=$OUT/ab_main2.json --columns sm90,paged:sm90 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt
{ for t in main merge; do echo "== $t H16_n16_B32_P8192_ragged"; in_tree $t timeout 40 python3 -m bench.profile_case H16_n16_B32_P8192_ragged --kernels --step 2>&1 | grep -v -i warn; done
  for case in H16_n4_B32_P1024 H128_n4_B8_P1024; do for t in main smallplan; do
    echo "== $t $case"; in_tree $t timeout 40 python3 -m bench.profile_case $case --kernels --step 2>&1 | grep -v -i warn; done; done; } > $OUT/kernels.log 2>&1
cat $OUT/kernels.log; echo "done at $SECONDS s"
