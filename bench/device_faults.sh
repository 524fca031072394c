#!/usr/bin/env bash
# The two open findings of the 2026-12-02 run, in one device call (bench/results/2026-12-02_H200_63f5d56/README.md):
# - the illegal memory access of bench/time_schedules.py over the first ragged pairs (split and the
#   persistent kernel forced), rerun as it ran, then under memcheck, with DDTREE_PDL=0 and 1;
# - racecheck's 18 hazards on st.scale1, rerun with racecheck's analysis report.
#   run(command="bash bench/device_faults.sh", carry=[".whl"])
# Writes $OUT/faults.tgz and $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
R=/tmp/faults; mkdir -p $R
source bench/device_common.sh
start_device_run || exit 1
export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc
timeout 200 python3 "$root/bench/build_libraries.py" 2>&1 | tail -n 1
cases=${CASES:-H16_n4_B8_P1024,H16_n4_B8_P8192,H16_n4_B32_P1024,H16_n4_B32_P8192}
for pdl in 1 0; do
  DDTREE_PDL=$pdl timeout 90 python3 bench/time_schedules.py $cases > $R/schedules_pdl$pdl.log 2>&1
  echo "schedules DDTREE_PDL=$pdl: exit $? $(grep -c ratio $R/schedules_pdl$pdl.log) cases" >> $R/summary.txt
  DDTREE_PDL=$pdl timeout 200 compute-sanitizer --tool memcheck --print-limit 20 --error-exitcode 9 \
    python3 bench/time_schedules.py $cases > $R/memcheck_schedules_pdl$pdl.log 2>&1
  echo "memcheck schedules DDTREE_PDL=$pdl: exit $? ($(grep 'ERROR SUMMARY' $R/memcheck_schedules_pdl$pdl.log | tail -n 1))" >> $R/summary.txt
done
timeout 200 compute-sanitizer --tool racecheck --racecheck-report analysis --print-level info --print-limit 40 \
  python3 -m pytest -q -p no:cacheprovider tests/test_gpu_determinism.py -k "sm90 and H16-B1-n4" > $R/racecheck_analysis.log 2>&1
echo "racecheck analysis: exit $? ($(grep 'RACECHECK SUMMARY' $R/racecheck_analysis.log | tail -n 1))" >> $R/summary.txt
cat $R/summary.txt; cp $R/summary.txt $OUT/; tar czf $OUT/faults.tgz -C $R .
