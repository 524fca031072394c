# Call 1 (fourth session): racecheck probe, racecheck hazard report of main, combine_early A/B.
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 DDTREE_CACHE_DIR=/tmp/ddc
(cd .snap/main && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 $root/bench/build_libraries.py > $OUT/build.log 2>&1) &
(timeout 150 python3 -m bench.racecheck_probe > $OUT/racecheck_probe.txt 2>&1) &
wait; echo "built $SECONDS"; cat $OUT/racecheck_probe.txt
(cd .snap/ce && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_persistent.py > $OUT/tests_ce.log 2>&1) &
(cd .snap/main && PYTHONPATH=/tmp/site:$PWD timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 8 \
   python3 -m pytest -q -p no:cacheprovider tests/test_gpu_determinism.py -k "sm90 and H16-B1-n4" > $OUT/racecheck_hazard_main.log 2>&1) &
wait; echo "tests ce: $(tail -n 1 $OUT/tests_ce.log) at $SECONDS"; grep -E "SUMMARY|passed|failed" $OUT/racecheck_hazard_main.log
for r in 1 2; do for t in main ce; do
  (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_COMMIT=$t timeout 80 python3 -m bench.verify --cases ragged_pairs --filter P8192 --no-prep --backends sm90 --out /tmp/r_${t}_$r 2>&1 | grep -E "wrote")
  cp /tmp/r_${t}_$r/results.json $OUT/p8192_${t}_$r.json; echo "$t $r at $SECONDS"
done; done
for r in 1 2; do PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/p8192_main_$r.json ce=$OUT/p8192_ce_$r.json > $OUT/ab_$r.txt 2>&1; grep -E "^sm90" $OUT/ab_$r.txt; done
