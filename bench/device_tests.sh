#!/usr/bin/env bash
# GPU tests in one device call: both CUDA libraries built once, then the tests of IDS_FILE (one
# pytest id per line, e.g. a process's share that a cut or a crash lost) or, without one, every
# test, through bench.parallel_tests; then, if the raw status-check tests fail, the probe of
# their cause (bench/check_message_probe.py).
#   run(command="bash bench/device_tests.sh [IDS_FILE]", carry=[".whl"])
# Writes under $OUT: tests.log, status_tests.log, probe.log (only when run), logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/ddc PYTHONUNBUFFERED=1
timeout "${BUILD_TIMEOUT:-200}" python3 -c 'import ddtree_op.build as b; b.load_library("prep"); b.load_library("sm90")' 2>&1 \
  | grep -v DEBUG | tail -n 2
echo "built at $SECONDS s"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_bounds_args.py -k "raw_cuda or prepare_op_checks" 2>&1 \
  | grep -v DEBUG | tail -n 8 > "$OUT/status_tests.log"
tail -n 1 "$OUT/status_tests.log"
if ! tail -n 1 "$OUT/status_tests.log" | grep -q "passed" || tail -n 1 "$OUT/status_tests.log" | grep -q "failed"; then
  timeout 150 python3 -m bench.check_message_probe > "$OUT/probe.log" 2>&1; cat "$OUT/probe.log"
fi
ids=()
[ $# -ge 1 ] && mapfile -t ids < "$1"
timeout -s INT $(( ${TEST_TIMEOUT:-300} + 40 )) python3 -m bench.parallel_tests --processes "${PROCESSES:-12}" \
  --timeout "${TEST_TIMEOUT:-300}" --log-dir /tmp/tests "${ids[@]}" > "$OUT/tests.log" 2>&1
echo "tests rc $? at $SECONDS s"; tail -n 16 "$OUT/tests.log"
[ -d /tmp/tests ] && tar czf "$OUT/logs.tgz" -C /tmp tests
