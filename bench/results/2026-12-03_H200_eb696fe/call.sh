set -u
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 DDTREE_CACHE_DIR=/tmp/ddc
(cd .snap/main && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 $root/bench/build_libraries.py > $OUT/build.log 2>&1); echo built $SECONDS
(cd .snap/gate && PYTHONPATH=/tmp/site:$PWD timeout 70 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_sm90.py tests/test_gpu_attention.py -k "sm90 or split or rising or negative or boxes" > $OUT/tests_gate.log 2>&1); echo "tests $(tail -n 1 $OUT/tests_gate.log) at $SECONDS"
for r in 1 2; do for t in main gate; do
  (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_COMMIT=$t timeout 40 python3 -m bench.verify --cases ragged_pairs --filter B8_P1024 --no-prep --backends sm90 --out /tmp/r_${t}_$r 2>&1 | grep -E "wrote")
  cp /tmp/r_${t}_$r/results.json $OUT/b8_${t}_$r.json; echo "$t $r at $SECONDS"
done; done
for r in 1 2; do PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/b8_main_$r.json gate=$OUT/b8_gate_$r.json > $OUT/ab_$r.txt 2>&1; grep -E "^sm90" $OUT/ab_$r.txt; done
