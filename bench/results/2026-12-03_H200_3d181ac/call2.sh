# Call 2 (fourth session): [scale1 ready] as an mbarrier (mb; mbp adds scale1 by pair parity):
# racecheck of both, the sm90 tests of both, the grid A/B against main (two rounds, in turns).
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
for t in main mb mbp; do
  (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_$t timeout 250 python3 $root/bench/build_libraries.py > $OUT/build_$t.log 2>&1) &
done
wait; echo "built $SECONDS"; tail -qn 1 $OUT/build_*.log
for t in mb mbp; do
  (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_$t timeout 200 compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_gpu_determinism.py -k "sm90 and (H16-B1-n4 or H16-B3 or H128-B8)" > $OUT/racecheck_$t.log 2>&1) &
done
(cd .snap/mb && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_mb timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_sm90.py tests/test_gpu_persistent.py \
   tests/test_gpu_determinism.py tests/test_gpu_attention.py -k "sm90 or split or rising or negative or boxes or persistent" > $OUT/tests_mb.log 2>&1) &
wait; echo "checked $SECONDS"; tail -qn 1 $OUT/tests_mb.log; for t in mb mbp; do echo "$t: $(grep -E 'RACECHECK SUMMARY' $OUT/racecheck_$t.log)"; done
v=mb; grep -q "0 hazards displayed (0 errors" $OUT/racecheck_mb.log || v=mbp
for r in 1 2; do for t in main $v; do
  (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_$t DDTREE_COMMIT=$t timeout 90 python3 -m bench.verify --cases grid --no-prep --backends sm90 --out /tmp/r_${t}_$r 2>&1 | grep -E "wrote")
  cp /tmp/r_${t}_$r/results.json $OUT/grid_${t}_$r.json; echo "$t $r at $SECONDS"
done; done
for r in 1 2; do PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/grid_main_$r.json $v=$OUT/grid_${v}_$r.json > $OUT/ab_$r.txt 2>&1; grep -E "^sm90" $OUT/ab_$r.txt; done
