#!/usr/bin/env bash
# The install paths, from this checkout, as a user without network access takes them (pip with
# --no-deps --no-build-isolation: torch, and on a GPU ninja and the CUTLASS headers, already there):
#   bash bench/install_check.sh [PART ...]      (default: jit aot wheel sdist)
#  jit    `pip install .` (compiles nothing); in a GPU machine the first import JIT-builds both CUDA
#         libraries from the installed package's own sources (ddtree_op/csrc), with a notice of the
#         start and the elapsed time; a second process reuses the cache; the demo runs from the
#         installed package.
#  aot    `DDTREE_AOT_BUILD=1 pip install .`: both libraries compiled at install time; the first
#         import loads them (no JIT notice, no cache directory made). GPU machine only.
#  wheel  `pip wheel .`: the wheel holds the ddtree_op package alone, with its CUDA sources,
#         py.typed and the license; installed, it imports.
#  sdist  the sdist builds, installs, and its tests collect; then $SDIST_TESTS run from it.
# Each part works in its own folder under $INSTALL_CHECK_ROOT (default /tmp/ddtree_install) on its
# own copy of the checkout (pip builds a source folder in place), so parts may run in parallel.
# Environment: EXTRA_PATH, PYTHONPATH entries for the builds and the checks (e.g. where the
# CUTLASS headers' wheel was installed); INSTALL_CHECK_CACHE, the JIT cache of the jit part and of
# the sdist's tests (default: a fresh folder, so the jit part's first import builds; a cache the
# checkout's own build filled is loaded instead, the libraries being keyed by their sources).
# setuptools >= 77 is needed to build (SPDX license metadata): where the environment's is older, a
# setuptools wheel in a folder .whl*/ of the checkout is installed for the builds.
# Prints "PASS part" or "FAIL part: why" per part and a last line with all of them; exits non-zero
# when a part failed.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root=${INSTALL_CHECK_ROOT:-/tmp/ddtree_install}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(jit aot wheel sdist)
SDIST_TESTS=${SDIST_TESTS:-tests/test_demo.py tests/test_build.py tests/test_readme.py tests/test_package_layout.py tests/test_sglang.py}
mkdir -p "$root"
build_path=${EXTRA_PATH:-}
check='import time, ddtree_op, ddtree_op.build as b
start = time.time(); paths = [b.load_library("prep"), b.load_library("sm90")]
print(f"ddtree_op {ddtree_op.__version__} from {ddtree_op.__file__}: libraries {paths} loaded in {time.time() - start:.1f} s")'

setuptools_ok() {
  PYTHONPATH=$build_path python3 -c 'import setuptools, sys
print("setuptools", setuptools.__version__, "from", setuptools.__file__)
sys.exit(int(setuptools.__version__.split(".")[0]) < 77)'
}
if ! setuptools_ok; then
  wheel=$(ls "$repo"/.whl*/setuptools-*.whl 2>/dev/null | sort -V | tail -1)
  tools="$root/tools.$$"
  if [ -n "$wheel" ] && python3 -m pip install -q --no-index --no-deps --target "$tools" "$wheel"; then
    build_path=$tools${build_path:+:$build_path}
  fi
  setuptools_ok || { echo "FAIL all: setuptools >= 77 is needed to build (SPDX license metadata): bring its wheel in .whl*/"; exit 1; }
fi

copy_source() {  # a private copy of the checkout (no VCS data, wheels, build outputs or caches)
  rm -rf "$1" && mkdir -p "$1"
  tar -C "$repo" --exclude=./.git --exclude='./.whl*' --exclude=./.venv --exclude=./build --exclude=./dist \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache -cf - . | tar -C "$1" -xf -
}

pip_build() {  # pip with the build's path; its output goes to $log, shown (the end) if it fails
  local log=$1
  shift
  PYTHONPATH=$build_path python3 -m pip "$@" > "$log" 2>&1 && return 0
  tail -30 "$log"
  return 1
}

run_from() {  # site cache cmd...: python with the installed copy first on the path, from a neutral folder
  local site=$1 cache=$2
  shift 2
  (cd /tmp && DDTREE_CACHE_DIR=$cache PYTHONPATH=$site${EXTRA_PATH:+:$EXTRA_PATH} "$@")
}

fail() { echo "FAIL $part: $*"; results+=("$part FAIL"); }

part_jit() {
  local dir=$root/jit cache=${INSTALL_CHECK_CACHE:-$root/jit/cache}
  rm -rf "$dir"; copy_source "$dir/src"
  pip_build "$dir/pip.log" install --no-deps --no-build-isolation --target "$dir/site" "$dir/src" || { fail "pip install . failed"; return; }
  test -f "$dir/site/ddtree_op/csrc/registration.cpp" || { fail "the CUDA sources are not in the installed package"; return; }
  test ! -e "$dir/site/cutlass_kernels" || { fail "a top-level cutlass_kernels package was installed"; return; }
  echo "installed in $dir/site; JIT cache $cache$([ -n "${INSTALL_CHECK_CACHE:-}" ] && echo ' (given: libraries built there from the same sources load without a build)')"
  for attempt in first second; do
    echo "-- $attempt import"
    run_from "$dir/site" "$cache" python3 -c "$check" 2>&1 | grep -v DEBUG | tail -4
    [ "${PIPESTATUS[0]}" = 0 ] || { fail "the $attempt import did not load the libraries"; return; }
  done
  echo "-- demo from the installed package"
  run_from "$dir/site" "$cache" python3 -m ddtree_op 2>&1 | tail -9
  [ "${PIPESTATUS[0]}" = 0 ] || { fail "the demo failed"; return; }
  echo "PASS jit"; results+=("jit PASS")
}

part_aot() {
  local dir=$root/aot start
  rm -rf "$dir"; copy_source "$dir/src"
  start=$(date +%s)
  DDTREE_AOT_BUILD=1 pip_build "$dir/pip.log" install -v --no-deps --no-build-isolation --target "$dir/site" "$dir/src" \
    || { fail "the AOT install failed"; return; }
  grep -E "^ddtree_op: DDTREE_AOT_BUILD" "$dir/pip.log"
  echo "AOT install took $(( $(date +%s) - start )) s; libraries: $(cd "$dir/site/ddtree_op" && ls _aot_*.so 2>/dev/null | tr '\n' ' ')"
  run_from "$dir/site" "$dir/cache" python3 -c "$check" 2>&1 | grep -v DEBUG | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || { fail "the installed AOT libraries did not load"; return; }
  test ! -e "$dir/cache" || { fail "a JIT build ran (a cache directory was made)"; return; }
  echo "no JIT build ran (no cache directory)"
  echo "PASS aot"; results+=("aot PASS")
}

part_wheel() {
  local dir=$root/wheel whl
  rm -rf "$dir"; copy_source "$dir/src"
  pip_build "$dir/pip.log" wheel --no-deps --no-build-isolation -w "$dir/dist" "$dir/src" || { fail "pip wheel . failed"; return; }
  whl=$(ls "$dir"/dist/ddtree_op-*.whl)
  python3 - "$whl" <<'EOF' || { fail "the wheel's contents are wrong (above)"; return; }
import sys, zipfile
path = sys.argv[1]
names = zipfile.ZipFile(path).namelist()
tops = sorted({n.split("/")[0] for n in names})
print(f"{path.rsplit('/', 1)[-1]}: {len(names)} files, top level {tops}")
problems = [what for what, bad in [
    ("only ddtree_op and its dist-info at the top", [t for t in tops if t != "ddtree_op" and not t.endswith(".dist-info")]),
    ("the CUDA sources in ddtree_op/csrc", "ddtree_op/csrc/registration.cpp" not in names or not any(n.startswith("ddtree_op/csrc/sm90/") for n in names)),
    ("py.typed", "ddtree_op/py.typed" not in names),
    ("the license", not any(n.endswith(".dist-info/licenses/LICENSE") for n in names)),
    ("no host-side test sources", [n for n in names if "layout_check" in n]),
] if bad]
sys.exit(f"missing or wrong: {problems}" if problems else 0)
EOF
  python3 -m pip install -q --no-deps --target "$dir/site" "$whl" > "$dir/install.log" 2>&1 || { tail "$dir/install.log"; fail "the wheel did not install"; return; }
  run_from "$dir/site" "$dir/cache" python3 -c 'import ddtree_op, ddtree_op.build as b
print("imports:", ddtree_op.__version__, ddtree_op.__file__, "sources", b.kernel_source_dir())' || { fail "the installed wheel does not import"; return; }
  echo "PASS wheel"; results+=("wheel PASS")
}

part_sdist() {
  local dir=$root/sdist tarball src collected
  rm -rf "$dir"; copy_source "$dir/src"
  tarball=$(cd "$dir/src" && PYTHONPATH=$build_path python3 -c 'import sys; from setuptools import build_meta as b
print(b.build_sdist(sys.argv[1]))' "$dir/dist" 2> "$dir/sdist.log" | tail -1) || { tail "$dir/sdist.log"; fail "the sdist did not build"; return; }
  test -f "$dir/dist/$tarball" || { tail "$dir/sdist.log"; fail "the sdist did not build"; return; }
  echo "$tarball: $(tar tzf "$dir/dist/$tarball" | wc -l) files"
  mkdir -p "$dir/unpacked" && tar -C "$dir/unpacked" -xzf "$dir/dist/$tarball"
  src=$(ls -d "$dir"/unpacked/ddtree_op-*)
  pip_build "$dir/pip.log" install --no-deps --no-build-isolation --target "$dir/site" "$src" || { fail "the sdist did not install"; return; }
  echo "installed from the sdist into $dir/site"
  # From the unpacked sdist, as a user who downloaded it runs its tests (pyproject puts its root on the path).
  collected=$(cd "$src" && PYTHONPATH=$dir/site${EXTRA_PATH:+:$EXTRA_PATH} python3 -m pytest -q -p no:cacheprovider --co tests \
    > "$dir/collect.log" 2>&1; echo $?)
  echo "collect: $(grep -E "[0-9]+ tests? collected|[0-9]+ errors?" "$dir/collect.log" | tail -2)"
  [ "$collected" = 0 ] || { tail -20 "$dir/collect.log"; fail "the sdist's tests do not collect"; return; }
  if [ -n "$SDIST_TESTS" ]; then
    echo "-- from the sdist: pytest $SDIST_TESTS"
    (cd "$src" && DDTREE_CACHE_DIR=${INSTALL_CHECK_CACHE:-$dir/cache} PYTHONPATH=$dir/site:$build_path \
      python3 -m pytest -q -p no:cacheprovider $SDIST_TESTS 2>&1 | grep -v DEBUG | tail -4; exit "${PIPESTATUS[0]}") \
      || { fail "tests from the sdist failed"; return; }
  fi
  echo "PASS sdist"; results+=("sdist PASS")
}

results=()
for part in "${parts[@]}"; do
  case "$part" in
    jit | aot | wheel | sdist) echo "== $part"; "part_$part" ;;
    *) echo "unknown part '$part' (jit, aot, wheel, sdist)"; results+=("$part FAIL") ;;
  esac
done
echo "install_check: ${results[*]}"
! grep -q FAIL <<<"${results[*]}"
