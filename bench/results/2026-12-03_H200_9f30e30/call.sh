set -u
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
for t in main cand; do (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_$t timeout 250 python3 $root/bench/build_libraries.py > $OUT/build_$t.log 2>&1) & done; wait
echo built $SECONDS
(cd .snap/cand && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_cand timeout 290 python3 -m bench.parallel_tests --processes 14 --timeout 240 --log-dir /tmp/tests tests > $OUT/gpu_tests_cand.log 2>&1); tail -n 4 $OUT/gpu_tests_cand.log
echo tested $SECONDS
for t in main cand; do
  c=af62c5a; [ $t = cand ] && c=9f30e30
  (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_$t DDTREE_COMMIT=$c timeout 150 python3 -m bench.verify --cases ragged_pairs --no-prep --backends sm90,flashmla --out /tmp/r_$t 2>&1 | grep -E "^NVIDIA|wrote")
  cp /tmp/r_$t/results.json $OUT/ragged_pairs_$t.json; echo "$t timed $SECONDS"
done
PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/ragged_pairs_main.json cand=$OUT/ragged_pairs_cand.json > $OUT/ab.txt 2>&1; grep -E "^sm90" $OUT/ab.txt
tar czf $OUT/test_logs.tgz -C /tmp tests
echo done $SECONDS
