#!/usr/bin/env bash
# A non-editable `pip install .` JIT-builds both CUDA libraries from the installed package's own
# sources, runs the demo, and reuses the build cache on the second import (run on the GPU machine).
set -uo pipefail
site=/tmp/ddtree_install; cache=/tmp/ddtree_install_cache
rm -rf "$site" "$cache"
python3 -m pip install -q --no-deps --no-build-isolation --target "$site" . || { echo "pip install . failed"; exit 1; }
cd /tmp || exit 1
check='import time, ddtree_op, ddtree_op.build as b
start = time.time(); b.load_library("prep"); b.load_library("sm90")
print(f"{ddtree_op.__file__}: both libraries loaded in {time.time() - start:.1f} s")'
for attempt in first second; do
  echo "== $attempt import"
  DDTREE_CACHE_DIR=$cache PYTHONPATH=$site:/tmp/site python3 -c "$check" 2>&1 | grep -v DEBUG | tail -3
done
echo "== demo from the installed package"
DDTREE_CACHE_DIR=$cache PYTHONPATH=$site:/tmp/site python3 -m ddtree_op 2>&1 | tail -8
