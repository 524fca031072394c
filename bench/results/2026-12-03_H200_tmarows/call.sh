# Eighth session, call 1: the one-row TMA probe, then tmarows against main (tests, grid, wait clocks, timeline).
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 60 python3 -m bench.tma_row_probe > $OUT/probe.txt 2>&1; tail -n 20 $OUT/probe.txt
WAIT_CLOCKS=1 bash bench/device_ab.sh main tmarows
