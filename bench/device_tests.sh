#!/usr/bin/env bash
# GPU tests in one device call: both CUDA libraries built once, then the tests of IDS_FILE (one
# pytest id per line, e.g. a process's share that a cut or a crash lost) or, without one, every
# test, through bench.parallel_tests; first, the raw status-check tests and, if they fail, the
# probe of their cause (bench/check_message_probe.py). The tests' time limit is what is left of
# LIMIT (default 590 s, counted from the start) less a margin, so the logs always come back.
#   run(command="bash bench/device_tests.sh [IDS_FILE]", carry=[".whl"])
# Writes under $OUT: tests.log, status_tests.log, probe.log (only when run), logs.tgz. Exits with
# the tests' status.
set -uo pipefail
ids_file=${1:+$(realpath "$1")}
cd "$(dirname "$0")/.."
root=$PWD
limit=${LIMIT:-590}
source bench/device_common.sh
start_device_run || exit 1
export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc
timeout "${BUILD_TIMEOUT:-200}" python3 "$root/bench/build_libraries.py" \
  > /tmp/build.log 2>&1 || { grep -v DEBUG /tmp/build.log | tail -n 5; echo "build failed"; exit 1; }
grep -v DEBUG /tmp/build.log | tail -n 2
echo "built at $SECONDS s"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_bounds_args.py -k "raw_cuda or prepare_op_checks" 2>&1 \
  | grep -v DEBUG | tail -n 8 > "$OUT/status_tests.log"
summary=$(tail -n 1 "$OUT/status_tests.log")
echo "$summary"
if [[ "$summary" != *passed* || "$summary" == *failed* || "$summary" == *error* ]]; then
  timeout 150 python3 -m bench.check_message_probe > "$OUT/probe.log" 2>&1; cat "$OUT/probe.log"
fi
ids=()
[ -n "$ids_file" ] && mapfile -t ids < "$ids_file"
budget=$(( limit - SECONDS - 45 ))  # parallel_tests stops its processes at the timeout, with 30 s of grace
[ "$budget" -gt 30 ] || { echo "no time left for the tests ($SECONDS s gone of $limit)"; exit 1; }
python3 -m bench.parallel_tests --processes "${PROCESSES:-12}" --timeout "$budget" --log-dir /tmp/tests \
  ${ids[@]+"${ids[@]}"} > "$OUT/tests.log" 2>&1
rc=$?
echo "tests rc $rc at $SECONDS s"; tail -n 16 "$OUT/tests.log"
[ -d /tmp/tests ] && tar czf "$OUT/logs.tgz" -C /tmp tests
exit $rc
