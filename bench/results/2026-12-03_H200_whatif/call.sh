# Eighth session, call 2: what-ifs of the gather's L2 reads (timing only): whalf reads rows 0-31 of
# each cp.async tile and zero-fills 32-63 (a cluster partner's share), wnone reads none. Against main,
# attention alone on the 35 grid shapes.
set -uo pipefail
root=$PWD
source bench/device_common.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1
for t in main whalf wnone; do in_snap_tree $t timeout 200 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"; for t in main whalf wnone; do tail -n 1 /tmp/build_$t.log; done
specs=()
for t in main whalf wnone; do
  b=sm90; [ $t = main ] && b=sm90,flashmla
  in_snap_tree $t timeout 100 python3 -m bench.verify --cases grid --no-prep --backends $b --out /tmp/r_$t 2>&1 | grep -E "wrote"
  cp /tmp/r_$t/results.json $OUT/grid_$t.json && specs+=("$t=$OUT/grid_$t.json"); echo "$t at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs "${specs[@]}" --columns sm90 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt | head -60
