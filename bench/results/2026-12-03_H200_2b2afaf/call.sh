# Sixth session, call 2: mergesplit (2b2afaf; the split kernel merges its pieces itself) built with
# kMergeMaxSplits = 8 (.snap/ms8), so that every split shape with 2-8 splits shows its own gain or
# loss, against main (52fbe66, .snap/main): ms8's GPU tests, then attention alone on the 20 split
# shapes with 2-8 splits and two with 9 (controls), as main, ms8, main again.
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
in_tree() { local t=$1; shift; local d=$root/.snap/$t
  (cd $d && PYTHONPATH=/tmp/site:$d DDTREE_CACHE_DIR=/tmp/ddc_$t "$@"); }
for t in main ms8; do in_tree $t timeout 200 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"; for t in main ms8; do tail -n 1 /tmp/build_$t.log; done
in_tree ms8 timeout 200 python3 -m bench.parallel_tests --processes 14 --timeout 160 --log-dir /tmp/tests_ms8 \
  tests/test_gpu_persistent.py tests/test_gpu_determinism.py tests/test_prepared.py tests/test_gpu_sm90.py \
  tests/test_gpu_attention.py tests/test_gpu_graphs.py tests/test_split_pieces.py > $OUT/tests_ms8.log 2>&1
echo "ms8 tests rc $? at $SECONDS s"; tail -n 3 $OUT/tests_ms8.log
shapes=H16_n4_B32_P1024\$,H16_n4_B32_P8192\$,H16_n16_B8_P1024\$,H16_n16_B8_P8192\$,H16_n64_B1_P1024,H16_n64_B1_P8192,H128_n4_B8_P1024\$,H128_n4_B8_P8192\$,H128_n16_B1_P1024,H128_n16_B1_P8192
shapes=$shapes,H16_n4_B32_P1024_ragged,H16_n4_B32_P8192_ragged,H16_n16_B8_P1024_ragged,H16_n16_B8_P8192_ragged,H128_n4_B8_P1024_ragged,H128_n4_B8_P8192_ragged
shapes=$shapes,dsv3_H16_chain4_B64_P4k,dsv3_H16_tree16_B16_P16k,dsv3_H16_tree64_B4_P32k,dsv3_H128_tree16_B1_P32k,H16_n4_B8_P1024\$,H16_n4_B1_P1024
for run in main ms8 main2; do t=${run%2}
  in_tree $t timeout 100 python3 -m bench.verify --cases all --filter "$shapes" --no-prep --backends sm90 --out /tmp/r_$run 2>&1 | grep -E "wrote"
  cp /tmp/r_$run/results.json $OUT/ab_$run.json; echo "$run at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/ab_main.json ms8=$OUT/ab_ms8.json main2=$OUT/ab_main2.json --columns sm90 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt
{ for t in main ms8; do for c in H128_n4_B8_P8192 H16_n16_B8_P8192; do echo "== $t $c"; in_tree $t timeout 40 python3 -m bench.profile_case $c --kernels 2>&1 | grep -v -i warn; done; done; } > $OUT/kernels.log 2>&1
cat $OUT/kernels.log; echo "done at $SECONDS s"
