# The preparation's plan with pieces written one a thread (pf = 6be15d7) against main (560c017):
# pf's preparation tests (the CUDA plan against its CPU twin, bit for bit), then the step's columns
# (preparation alone, one-call step, per layer, attention) on the 14 B1 shapes, main then pf.
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
in_tree() { local t=$1; shift; (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_$t DDTREE_COMMIT=$t "$@"); }
in_tree pf timeout 120 python3 $root/bench/build_libraries.py > /tmp/build_pf.log 2>&1; echo "pf built $SECONDS"
in_tree main timeout 120 python3 $root/bench/build_libraries.py > /tmp/build_main.log 2>&1 &
in_tree pf timeout 110 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_prep.py tests/test_split_pieces.py \
  tests/test_persistent_schedule.py > $OUT/tests_pf.log 2>&1 &
wait; echo "main built, pf tests: $(tail -n 1 $OUT/tests_pf.log) at $SECONDS"
for t in main pf; do
  in_tree $t timeout 60 python3 -m bench.verify --cases all --filter B1_ --backends sm90 --out /tmp/r_$t 2>&1 | grep -E "wrote"
  cp /tmp/r_$t/results.json $OUT/${t}_B1.json; echo "$t at $SECONDS"
done
PYTHONPATH=$root python3 -c "
import json,math
a={r['case']:r['time_us'] for r in json.load(open('$OUT/main_B1.json'))['rows']}
b={r['case']:r['time_us'] for r in json.load(open('$OUT/pf_B1.json'))['rows']}
for k in ['prepare_fused','step[sm90]','per_layer[sm90]','sm90']:
    r=[b[c][k]/a[c][k] for c in a if c in b and k in a[c] and k in b[c]]
    print(k, len(r), 'pf/main %.4f (%.3f-%.3f)'%(math.exp(sum(map(math.log,r))/len(r)),min(r),max(r)))
"
