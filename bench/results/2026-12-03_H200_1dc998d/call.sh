# Fifth session, call 3 (the device time left: ~200 s): cg (1dc998d, the persistent combine in
# (CTAs, 4) programs of 16 rows) against main (1b55c2c, .snap/main): attention alone on the four
# ragged shapes where auto takes the persistent kernel and their uniform twins, main then cg, then
# cg's persistent-kernel tests.
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
cp bench/verify.py .snap/main/bench/verify.py  # its --filter takes the comma list below
in_tree() { local t=$1; shift; local d=$root c=1dc998d; [ "$t" = cg ] || { d=$root/.snap/$t; c=1b55c2c; }
  (cd $d && PYTHONPATH=/tmp/site:$d DDTREE_CACHE_DIR=/tmp/ddc_$t DDTREE_COMMIT=$c "$@"); }
for t in main cg; do in_tree $t timeout 150 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"
shapes=H16_n16_B32_P8192\$,H16_n16_B32_P8192_ragged,H16_n64_B8_P8192\$,H16_n64_B8_P8192_ragged,H128_n4_B32_P8192\$,H128_n4_B32_P8192_ragged,H128_n16_B8_P8192\$,H128_n16_B8_P8192_ragged
for t in main cg; do
  in_tree $t timeout 45 python3 -m bench.verify --cases all --filter "$shapes" --no-prep --backends sm90 --out /tmp/r_$t 2>&1 | grep -E "wrote"
  cp /tmp/r_$t/results.json $OUT/ab_$t.json; echo "$t at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/ab_main.json cg=$OUT/ab_cg.json --columns sm90 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt
in_tree cg timeout 80 python3 -m bench.parallel_tests --processes 10 --timeout 70 --log-dir /tmp/tests_cg \
  tests/test_gpu_persistent.py > $OUT/tests_cg.log 2>&1
echo "cg tests rc $? at $SECONDS s"; tail -n 2 $OUT/tests_cg.log
