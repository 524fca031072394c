# Landing run of the final tree (fourth session): the whole GPU suite, racecheck of the landed
# kernel (bench/device_landing.sh) and, beside them, racecheck of the mb tree (.snap/mb).
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
(cd .snap/mb && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_mb timeout 200 python3 $root/bench/build_libraries.py > /tmp/build_mb.log 2>&1 \
  && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_mb timeout 300 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 40 \
     python3 -m pytest -q -p no:cacheprovider tests/test_gpu_determinism.py -k "sm90 and (H16-B1-n4 or H16-B3 or H128-B8)" > /tmp/racecheck_mb.log 2>&1
 grep -v "Host Frame" /tmp/racecheck_mb.log | cut -c1-300 > $OUT/racecheck_mb.txt) &
DDTREE_COMMIT=560c017 TESTS=tests RACECHECK=1 COSTS=0 GRID_S=1 TEST_S=330 PROCESSES=14 bash bench/device_landing.sh
wait
grep -E "SUMMARY|passed|failed" $OUT/racecheck_mb.txt
