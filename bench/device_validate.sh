#!/usr/bin/env bash
# The SGLang integration and the install paths on a GPU machine without network access, in one
# call of about 4 minutes, from the repository root (a copy of the working tree; .git not needed):
#   OUT=<output folder> DDTREE_COMMIT=<commit> bash bench/device_validate.sh
# Carried beside the tree: .whl/ (the nvidia-cutlass headers' wheel, ...), installed with
# `pip --no-index --no-deps --target /tmp/site`; optionally .whl-build/ (a setuptools >= 77 wheel,
# for the builds where the machine's setuptools is older: bench/install_check.sh takes it).
# Steps (each under `timeout -s INT`; a failed step never stops the script):
#   wheels        the carried wheels into /tmp/site
#   build         both CUDA libraries JIT-built once into the shared cache $DDTREE_CACHE_DIR; the
#                 later steps load them from there (also the installed copies: the cache is keyed
#                 by the sources' contents)
#   install-aot   (in the background from the start) bench/install_check.sh aot: the libraries
#                 compiled at install time and loaded without a JIT build
#   demo          `python -m ddtree_op` (the README's quick start) on the GPU, `auto`, alone
#   demo-triton   the same with `--backend triton` (beside the install step)
#   install       (in the background, after the demo) bench/install_check.sh jit wheel sdist:
#                 `pip install .` and its demo, `pip wheel .` and its contents, the sdist built,
#                 installed, its tests collected and a set of them run from it
#   sglang-gpu    tests/test_sglang_gpu.py (SGLang-produced metadata through the adapter and the
#                 subclass, eager and captured in a CUDA graph replayed with new trees, sm90 and
#                 Triton) and the CUDA cases of tests/test_sglang.py
#   sglang-extend whether SGLang's own Triton extend kernel imports (bench/sglang_triton_extend.py,
#                 the benchmark's callable), only where .whl-sglang/ holds sglang and its
#                 dependencies for this Python (else skipped, saying why)
# Writes $OUT/validate_summary.txt (one line per step), $OUT/validate_sglang.log and
# $OUT/validate_install.log (environment, wheels, build, demo, install checks). Exits 0.
set -uo pipefail
: "${OUT:?set OUT to the folder the logs go to}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
commit=${DDTREE_COMMIT:-unknown}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DDTREE_CACHE_DIR=${DDTREE_CACHE_DIR:-/tmp/ddc}
tmp=/tmp/ddtree_validate
rm -rf "$tmp" && mkdir -p "$tmp"
t0=$(date +%s)

budget=${VALIDATE_BUDGET:-500}  # seconds for the whole script: no step runs past t0 + budget

# step NAME LIMIT PATTERN CMD...: CMD under `timeout -s INT LIMIT` (cut to what is left of the
# budget), its output in $tmp/NAME.log; $tmp/NAME.sum gets "NAME: PASS|FAIL (rc)|TIMEOUT,
# seconds; the output lines matching PATTERN".
step() {
  local name=$1 limit=$2 pattern=$3 start rc verdict took detail
  shift 3
  start=$(date +%s)
  if [ $((t0 + budget - start)) -lt "$limit" ]; then limit=$((t0 + budget - start)); fi
  if [ "$limit" -lt 10 ]; then skip "$name" "out of time: the script's budget of ${budget}s is spent"; return; fi
  echo "== $name: $* (limit ${limit}s, started at +$((start - t0))s)" > "$tmp/$name.log"
  timeout -s INT -k 20 "$limit" "$@" >> "$tmp/$name.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  case $rc in
    0) verdict=PASS ;;
    124 | 137) verdict="TIMEOUT after ${limit}s" ;;
    *) verdict="FAIL (rc $rc)" ;;
  esac
  echo "-- $name: $verdict in ${took}s" >> "$tmp/$name.log"
  detail=$(grep -v DEBUG "$tmp/$name.log" | grep -E -- "$pattern" | tail -4 | sed 's/^ *//' | paste -sd';' - | sed 's/;/; /g')
  echo "$name: $verdict, ${took}s${detail:+; $detail}" > "$tmp/$name.sum"
}

skip() {  # NAME WHY
  echo "$1: SKIP ($2)" > "$tmp/$1.sum"
  echo "== $1: skipped: $2" > "$tmp/$1.log"
}

publish() {  # the logs by topic and the summary, from what has finished so far (a cut run keeps them)
  local name
  {
    cat "$tmp/env.log"
    for name in wheels build demo demo-triton install-aot install; do
      [ -f "$tmp/$name.sum" ] && { grep -v DEBUG "$tmp/$name.log"; echo; }
    done
  } > "$OUT/validate_install.log"
  {
    head -1 "$tmp/env.log"
    for name in sglang-gpu sglang-wheels sglang-extend; do
      [ -f "$tmp/$name.sum" ] && { grep -v DEBUG "$tmp/$name.log"; echo; }
    done
  } > "$OUT/validate_sglang.log"
  {
    echo "device_validate.sh, commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - t0 )) s"
    sed -n 2p "$tmp/env.log"
    grep '^python ' "$tmp/env.log"
    for name in wheels build install-aot demo demo-triton install sglang-gpu sglang-extend; do
      cat "$tmp/$name.sum" 2>/dev/null || echo "$name: not finished"
    done
  } > "$OUT/validate_summary.txt"
}

py_versions='import sys, torch, setuptools
try:
    import triton; tv = triton.__version__
except Exception as exc:
    tv = f"none ({exc})"
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), triton {tv}, "
      f"setuptools {setuptools.__version__}, GPU {torch.cuda.get_device_name() if torch.cuda.is_available() else None}")'
{
  echo "commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)"
  nvidia-smi -L 2>&1 | head -8
  python3 -c "$py_versions" 2>&1 | tail -1
  nvcc --version 2>&1 | tail -2 | head -1
  echo "ninja $(ninja --version 2>&1), $(python3 -m pip --version 2>&1 | cut -d' ' -f1-2)"
} > "$tmp/env.log" 2>&1
publish

# 1. the carried wheels
if compgen -G ".whl/*.whl" > /dev/null; then
  step wheels 60 "Successfully installed|ERROR" \
    python3 -m pip install --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
else
  skip wheels "no .whl/ here: the sm90 kernel needs the CUTLASS headers' wheel; auto runs Triton without it"
fi
publish

# 2. the AOT install in the background (nvcc on the CPU; its own copy of the tree and its own folder)
( EXTRA_PATH=/tmp/site INSTALL_CHECK_ROOT=/tmp/ddtree_install step install-aot 300 \
    "AOT install took|loaded in|JIT build|PASS|FAIL" bash bench/install_check.sh aot ) &
aot_pid=$!

# 3. both libraries, once, into the shared cache
step build 240 "JIT-compiling|built the|Error|error:" python3 -c 'import ddtree_op.build as b
print("prep:", b.load_library("prep")); print("sm90:", b.load_library("sm90"))'
publish

# 4. the demo, as the README's quick start runs it (alone on the GPU: it prints times per step)
step demo 120 "^backend:|^eager|^torch.compile|^CUDA graph|Error|error:" python3 -m ddtree_op
publish

# 5. pip install . / pip wheel . / the sdist, in the background (the cache above is shared; the
# sdist's tests: the demo's and the adapter's, on the GPU)
( EXTRA_PATH=/tmp/site INSTALL_CHECK_ROOT=/tmp/ddtree_install INSTALL_CHECK_CACHE=$DDTREE_CACHE_DIR \
    SDIST_TESTS="tests/test_demo.py tests/test_sglang.py tests/test_readme.py tests/test_package_layout.py" \
    step install 240 "loaded in|^collect:|passed|install_check:" bash bench/install_check.sh jit wheel sdist ) &
install_pid=$!

step demo-triton 120 "^backend:|^eager|^torch.compile|^CUDA graph|Error|error:" python3 -m ddtree_op --backend triton
publish

# 6. the SGLang integration's GPU tests
step sglang-gpu 180 "passed|failed|skipped|error|no tests ran" python3 -m pytest -v -rs -p no:cacheprovider \
  tests/test_sglang_gpu.py tests/test_sglang.py -k "test_sglang_gpu or (cuda and not cpu)"
publish

# 7. SGLang's own extend kernel, where its wheels were carried
if compgen -G ".whl-sglang/*.whl" > /dev/null; then
  step sglang-wheels 90 "ERROR|Successfully" \
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-sglang .whl-sglang/*.whl
  PYTHONPATH=/tmp/site-sglang:$PYTHONPATH step sglang-extend 120 "available|Error" python3 -c '
from bench import sglang_triton_extend as ext
ok, why = ext.available()
print("available:", ok, why)
raise SystemExit(0 if ok else 1)'
else
  skip sglang-extend "no .whl-sglang/: sglang is not installed here, so its Triton extend kernel cannot be timed"
fi

wait "$aot_pid" "$install_pid"
publish
cat "$OUT/validate_summary.txt"
exit 0
