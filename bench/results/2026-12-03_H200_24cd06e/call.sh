# Fifth session, call 2: smallplan (24cd06e, the plan of B <= 32 by one warp) against main
# (1b55c2c, lanes landed): smallplan's plan, preparation and sm90 tests; the step's columns on the
# P1024 shapes (B1/B8/B32; preparation, one-call step, per layer), main then smallplan; then the
# README's 66 shapes on the tree that passed (smallplan unless its tests failed), and the
# attention's kernels one by one on two ragged persistent shapes and their uniform twins.
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
in_tree() { local t=$1; shift; local d=$root c=24cd06e; [ "$t" = small ] || { d=$root/.snap/$t; c=1b55c2c; }
  (cd $d && PYTHONPATH=/tmp/site:$d DDTREE_CACHE_DIR=/tmp/ddc_$t DDTREE_COMMIT=$c "$@"); }
for t in main small; do in_tree $t timeout 200 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"; for t in main small; do tail -n 1 /tmp/build_$t.log; done
in_tree small timeout 150 python3 -m bench.parallel_tests --processes 10 --timeout 140 --log-dir /tmp/tests_small \
  tests/test_gpu_prep.py tests/test_gpu_sm90.py tests/test_gpu_persistent.py tests/test_gpu_graphs.py > $OUT/tests_small.log 2>&1
rc=$?; echo "small tests rc $rc at $SECONDS s"; tail -n 3 $OUT/tests_small.log
final=small; [ $rc = 0 ] || final=main
for t in main small; do
  in_tree $t timeout 90 python3 -m bench.verify --cases all --filter P1024 --backends sm90 --out /tmp/r_$t 2>&1 | grep -E "wrote"
  cp /tmp/r_$t/results.json /tmp/ab_$t.json; echo "$t at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs main=/tmp/ab_main.json small=/tmp/ab_small.json \
  --columns prepare_fused,step[sm90],per_layer[sm90],sm90 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt | tail -n 8
echo "grid on $final"
in_tree $final timeout 230 python3 -m bench.verify --cases all --backends sm90,flashmla,paged:sm90 --out /tmp/r_grid 2>&1 | grep -E "^NVIDIA|wrote"
cp /tmp/r_grid/results.json /tmp/grid_step_$final.json; echo "grid at $SECONDS s"
in_tree $final python3 -m bench.step_variants /tmp/r_grid/results.json per_layer --small-floor 5 2>&1 | tee $OUT/per_layer_summary.txt | tail -n 5
for c in H16_n16_B32_P8192 H16_n16_B32_P8192_ragged H128_n4_B32_P8192 H128_n4_B32_P8192_ragged; do
  echo "== $c"; in_tree $final timeout 40 python3 -m bench.profile_case $c --backend sm90 --kernels 2>&1 | grep -v -i "warn"
done > $OUT/kernels_ragged.log 2>&1
cat $OUT/kernels_ragged.log
(cd /tmp && tar czf $OUT/results.tgz ab_main.json ab_small.json grid_step_$final.json tests_small)
echo "done at $SECONDS s"
