# One call (2026-12-03, fifth session): lanes (2a133d3, equal shares lane by lane) against main (00d77ce): lanes' plan and
# persistent tests, attention alone on the 22 P8192 ragged-pair shapes (main, lanes, FlashMLA
# beside), DRAM bytes and L2 hits of the four persistent ragged shapes on both trees,
# then the preparation under ncu on H16_n4_B1_P1024 (main and 3b0ce2f) and the step's kernels.
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1
in_tree() { local t=$1; shift; (cd .snap/$t && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc_$t DDTREE_COMMIT=$t "$@"); }
for t in main lanes old; do in_tree $t timeout 200 python3 $root/bench/build_libraries.py > /tmp/build_$t.log 2>&1 & done
wait; echo "built at $SECONDS s"; for t in main lanes old; do tail -n 1 /tmp/build_$t.log; done
in_tree lanes timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_prep.py -k "plan" tests/test_gpu_persistent.py \
  tests/test_persistent_schedule.py tests/test_split_pieces.py > $OUT/tests_lanes.log 2>&1
echo "lanes tests: $(tail -n 1 $OUT/tests_lanes.log) at $SECONDS s"
for t in main lanes; do
  in_tree $t timeout 130 python3 -m bench.verify --cases ragged_pairs --filter P8192 --no-prep --backends sm90,flashmla --out /tmp/r_$t 2>&1 | grep -E "wrote"
  cp /tmp/r_$t/results.json $OUT/ab_$t.json; echo "$t at $SECONDS s"
done
PYTHONPATH=$root python3 -m bench.compare_runs main=$OUT/ab_main.json lanes=$OUT/ab_lanes.json --columns sm90,flashmla > $OUT/ab.txt 2>&1
(cd $OUT && tar czf ab_json.tgz ab_*.json && rm ab_*.json)
cat $OUT/ab.txt | head -40
for t in main lanes; do
  for c in H16_n16_B32_P8192_ragged H16_n64_B8_P8192_ragged H128_n4_B32_P8192_ragged H128_n16_B8_P8192_ragged H16_n16_B32_P8192; do
    echo "== $t $c"
    in_tree $t timeout 60 ncu --clock-control none --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
      -k regex:verify_attention --launch-skip 1 --launch-count 1 python3 -m bench.profile_case $c --backend sm90 --iters 2 2>&1 \
      | grep -E "dram__|lts__|gpu__time"
  done
done > $OUT/l2_ragged.log 2>&1
cat $OUT/l2_ragged.log; echo "l2 at $SECONDS s"
for t in main old; do
  for c in H16_n4_B1_P1024 H16_n4_B1_P8192; do
    echo "== $t $c"; in_tree $t timeout 60 python3 -m bench.profile_case $c --backend sm90 --kernels --step 2>&1 | tail -n 6
  done
done > $OUT/kernels.log 2>&1
cat $OUT/kernels.log; echo "kernels at $SECONDS s"
for t in main old; do
  mkdir -p /tmp/ncu_$t
  (export TREE=$root/.snap/$t DDTREE_CACHE_DIR=/tmp/ddc_$t STEP=1 KERNEL=prepare_verify OUT=/tmp/ncu_$t
   timeout 100 bash $root/bench/device_ncu.sh H16_n4_B1_P1024) 2>&1 | tail -n 4
  cp /tmp/ncu_$t/ncu.tgz $OUT/ncu_prep_$t.tgz
done
echo "done at $SECONDS s"
