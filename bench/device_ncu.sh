#!/usr/bin/env bash
# An ncu profile of one backend on one benchmark shape, in one device call: builds the libraries,
# profiles one launch (--set full, clocks left alone), prints the details page and exports the
# source page (SASS, per-instruction stall samples) for bench.ncu_roles here.
#   run(command="bash bench/device_ncu.sh H128_n64_B8_P8192 [BACKEND]", carry=[".whl"])
# SCHEDULE=split|persistent forces the sm90 kernel's schedule (bench.profile_case --schedule).
# STEP=1 runs the whole step (bench.profile_case --step), so that KERNEL=prepare_verify profiles
# the preparation launch. FP8=1: the whole step with an e4m3 cache (bench.profile_case --fp8;
# KERNEL=verify_attention_transposed for the transposed kernel).
# Writes $OUT/ncu.tgz: details.txt, sass.csv, run.log.
set -uo pipefail
scripts=$(cd "$(dirname "$0")/.." && pwd)
cd "${TREE:-$scripts}"  # TREE: a snapshot (bench/snapshot_trees.sh) to profile instead of this tree
root=$PWD
case=${1:?usage: device_ncu.sh CASE [BACKEND]} backend=${2:-sm90}
R=/tmp/ncu_out; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$scripts"/.whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=${DDTREE_CACHE_DIR:-/tmp/ddc} PYTHONUNBUFFERED=1
timeout 200 python3 "$root/bench/build_libraries.py" > $R/build.log 2>&1
timeout 200 ncu --clock-control none --set full --import-source no -k regex:"${KERNEL:-verify_attention}" --launch-skip 1 --launch-count 1 \
  -o $R/prof -f python3 -m bench.profile_case "$case" --backend "$backend" --iters 2 --schedule "${SCHEDULE:-auto}" ${STEP:+--step} ${FP8:+--fp8} > $R/run.log 2>&1
ncu --import $R/prof.ncu-rep --page details > $R/details.txt 2>&1
ncu --import $R/prof.ncu-rep --page source --csv --print-source sass > $R/sass.csv 2>&1
grep -E "Elapsed Cycles|Duration|Executed Ipc A|Issue Slots" $R/details.txt
rm -f $R/prof.ncu-rep
tar czf $OUT/ncu.tgz -C $R .
