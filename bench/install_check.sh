#!/usr/bin/env bash
# The install paths on a GPU machine, from this checkout (run it there: `bash bench/install_check.sh`):
#  1. `pip install .` (no compile): the first import JIT-builds both CUDA libraries from the
#     installed package's own sources (ddtree_op/csrc), with a notice of the start and the elapsed
#     time; a second process reuses the cache; the demo runs from the installed package.
#  2. `DDTREE_AOT_BUILD=1 pip install .`: both libraries compiled at install time; the first import
#     loads them (no JIT notice, no cache directory made).
# Extra PYTHONPATH entries (e.g. where the CUTLASS headers' wheel was installed) go in $EXTRA_PATH.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root=/tmp/ddtree_install
rm -rf "$root"
mkdir -p "$root"
check='import time, ddtree_op, ddtree_op.build as b
start = time.time(); paths = [b.load_library("prep"), b.load_library("sm90")]
print(f"ddtree_op {ddtree_op.__version__} from {ddtree_op.__file__}: libraries {paths} loaded in {time.time() - start:.1f} s")'

run_from() {  # site cache: run python with the installed copy first on the path, from a neutral folder
  local site=$1 cache=$2
  shift 2
  (cd /tmp && DDTREE_CACHE_DIR=$cache PYTHONPATH=$site${EXTRA_PATH:+:$EXTRA_PATH} "$@")
}

# --no-build-isolation (no index to fetch a build backend from) needs pyproject's setuptools here.
python3 -c 'import setuptools, sys; print("setuptools", setuptools.__version__); sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' \
  || { echo "setuptools >= 77 is needed (SPDX license metadata): bring its wheel"; exit 1; }

echo "== 1. pip install . (JIT on first use)"
python3 -m pip install -q --no-deps --no-build-isolation --target "$root/jit" "$repo" || { echo "pip install . failed"; exit 1; }
test -f "$root/jit/ddtree_op/csrc/registration.cpp" || { echo "the CUDA sources are not in the installed package"; exit 1; }
test ! -e "$root/jit/cutlass_kernels" || { echo "a top-level cutlass_kernels package was installed"; exit 1; }
for attempt in first second; do
  echo "-- $attempt import"
  run_from "$root/jit" "$root/cache" python3 -c "$check" 2>&1 | grep -v DEBUG | tail -4
done
echo "-- demo from the installed package"
run_from "$root/jit" "$root/cache" python3 -m ddtree_op 2>&1 | tail -9

echo "== 2. DDTREE_AOT_BUILD=1 pip install . (compiled at install time)"
start=$(date +%s)
DDTREE_AOT_BUILD=1 PYTHONPATH=${EXTRA_PATH:-} python3 -m pip install -q --no-deps --no-build-isolation --target "$root/aot" "$repo" \
  || { echo "the AOT install failed"; exit 1; }
echo "AOT install took $(( $(date +%s) - start )) s; libraries: $(cd "$root/aot/ddtree_op" && ls _aot_*.so | tr '\n' ' ')"
run_from "$root/aot" "$root/aot_cache" python3 -c "$check" 2>&1 | grep -v DEBUG | tail -4
test ! -e "$root/aot_cache" && echo "no JIT build ran (no cache directory)" || echo "UNEXPECTED: a JIT build ran"
