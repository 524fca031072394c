# Seventh session, call 1: the prepared branches pieceptr (79f410a) and squeue (9d11641) against
# main (fa5b666) with the preparation and the step timed, wait clocks of all three; then an ncu
# profile of main's kernel on H128_n64_B8_P8192 (issue slots and stalls per role, bench.ncu_roles).
set -uo pipefail
WAIT_CLOCKS=1 WITH_PREP=1 GRID_TIMEOUT=200 bash bench/device_ab.sh main pieceptr squeue
echo "ab done at $SECONDS s"
mkdir -p /tmp/ncu_main && OUT=/tmp/ncu_main TREE=$PWD/.snap/main DDTREE_CACHE_DIR=/tmp/ddc_main timeout 200 bash bench/device_ncu.sh H128_n64_B8_P8192
cp /tmp/ncu_main/ncu.tgz $OUT/ncu_main.tgz
echo "done at $SECONDS s"
