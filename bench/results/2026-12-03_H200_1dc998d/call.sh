# Fifth session, call 3: cg (1dc998d, the persistent combine in (CTAs, 4) programs of 16 rows)
# against main (1b55c2c, .snap/main): cg's persistent and graph tests; attention alone on the four
# ragged shapes where auto takes the persistent kernel and their uniform twins, main then cg; the
# README's 66 shapes on the tree that passed; then, while time is left, its preparation tests.
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
cp bench/verify.py .snap/main/bench/verify.py  # its --filter takes the comma list below
in_tree() { local t=$1; shift; local d=$root c=1dc998d; [ "$t" = cg ] || { d=$root/.snap/$t; c=1b55c2c; }
  (cd $d && PYTHONPATH=/tmp/site:$d DDTREE_CACHE_DIR=/tmp/ddc_$t DDTREE_COMMIT=$c "$@"); }
for t in main cg; do in_tree $t timeout 200 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"
in_tree cg timeout 100 python3 -m bench.parallel_tests --processes 10 --timeout 90 --log-dir /tmp/tests_cg \
  tests/test_gpu_persistent.py tests/test_gpu_graphs.py > $OUT/tests_cg.log 2>&1
rc=$?; echo "cg tests rc $rc at $SECONDS s"; tail -n 2 $OUT/tests_cg.log
final=cg; [ $rc = 0 ] || final=main
shapes=H16_n16_B32_P8192\$,H16_n16_B32_P8192_ragged,H16_n64_B8_P8192\$,H16_n64_B8_P8192_ragged,H128_n4_B32_P8192\$,H128_n4_B32_P8192_ragged,H128_n16_B8_P8192\$,H128_n16_B8_P8192_ragged
for t in main cg; do
  in_tree $t timeout 60 python3 -m bench.verify --cases all --filter "$shapes" --no-prep --backends sm90 --out /tmp/r_$t 2>&1 | grep -E "wrote"
  cp /tmp/r_$t/results.json /tmp/ab_$t.json; echo "$t at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs main=/tmp/ab_main.json cg=/tmp/ab_cg.json --columns sm90 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt
echo "grid on $final"
in_tree $final timeout 200 python3 -m bench.verify --cases all --backends sm90,flashmla,paged:sm90 --out /tmp/r_grid 2>&1 | grep -E "^NVIDIA|wrote"
cp /tmp/r_grid/results.json $OUT/grid_step.json; echo "grid at $SECONDS s"
in_tree $final python3 -m bench.step_variants /tmp/r_grid/results.json per_layer --small-floor 5 > $OUT/per_layer_summary.txt 2>&1
head -n 4 $OUT/per_layer_summary.txt
left=$((440 - SECONDS))
if [ $left -gt 30 ]; then
  in_tree $final timeout $left python3 -m bench.parallel_tests --processes 12 --timeout $((left - 10)) --log-dir /tmp/tests_final \
    tests/test_gpu_prep.py tests/test_gpu_sm90.py > $OUT/tests_final.log 2>&1
  echo "final tests rc $? at $SECONDS s"; tail -n 2 $OUT/tests_final.log
fi
(cd /tmp && tar czf $OUT/ab_json.tgz ab_main.json ab_cg.json tests_cg)
echo "done at $SECONDS s"
