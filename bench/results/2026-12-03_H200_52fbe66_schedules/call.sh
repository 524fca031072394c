# Sixth session, call 4: with the persistent kernel's merge in the kernel (52fbe66), the split and
# the persistent kernel on the same inputs for the multi-request shapes with splits > 1 and >= 15
# units a CTA (where auto takes the split kernel; the device plan picks equal shares for three
# of the ragged ones): bench/time_schedules.py, split then persistent per case.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 bench/build_libraries.py 2>&1 | tail -n 1
cases=H16_n4_B32_P8192,H16_n4_B32_P8192_ragged,H16_n16_B8_P8192,H16_n16_B8_P8192_ragged,H128_n4_B8_P8192,H128_n4_B8_P8192_ragged
cases=$cases,dsv3_H16_chain4_B64_P4k,dsv3_H16_tree16_B16_P16k,dsv3_H16_tree64_B4_P32k,H16_n4_B8_P8192,H16_n4_B8_P8192_ragged
timeout 300 python3 bench/time_schedules.py $cases 2>&1 | grep -v -i warn | tee $OUT/schedules.log
echo "done at $SECONDS s"
