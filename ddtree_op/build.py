"""Build and load the CUDA libraries (cutlass_kernels/, installed as ddtree_op/csrc/): JIT on first
CUDA use, or ahead of time from setup.py (DDTREE_AOT_BUILD=1).

Two libraries, so that the preparation kernels never depend on CUTLASS or on a Hopper GPU:
- "prep" (cutlass_kernels/*.cu, *.cpp): combined indices and mask conversion, torch.ops.ddtree_cuda.*;
- "sm90" (cutlass_kernels/sm90/*.cu): the CuTe/wgmma attention kernel, torch.ops.ddtree_sm90.*;
  needs the nvidia-cutlass headers and an sm_90 GPU.

The JIT build goes through torch.utils.cpp_extension + ninja into a directory named by a hash of
the sources, the flags, the GPU arch and the torch/CUDA versions, so an edit or an upgrade
rebuilds and everything else reuses the cache. An exclusive flock (released by the kernel if a
build is killed) serialises builds across processes; under it, a `lock` file that a killed torch
build left behind is removed instead of being waited on forever. An ahead-of-time library is
named by the same key (aot_module_name) and loaded only where it matches.

This module imports nothing from ddtree_op: setup.py loads it by path.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import sys
import time
from pathlib import Path

import torch

log = logging.getLogger("ddtree_op")

LIBRARIES = {"prep": "", "sm90": "sm90"}  # library -> folder of its .cu/.cpp under cutlass_kernels/


_PACKAGE_DIR = Path(__file__).resolve().parent  # this file sits at the top of the ddtree_op package


def kernel_source_dir() -> Path:
    """The CUDA sources: `ddtree_op/csrc/` in an installed wheel (setup.py maps the repository's
    `cutlass_kernels/` there), else `cutlass_kernels/` beside the package (a checkout, an editable
    install, or a copy of the tree on PYTHONPATH)."""
    for candidate in (_PACKAGE_DIR / "csrc", _PACKAGE_DIR.parent / "cutlass_kernels"):
        if (candidate / "registration.cpp").is_file():
            return candidate
    raise RuntimeError(f"ddtree_op: the CUDA sources are missing (looked for {_PACKAGE_DIR / 'csrc'} and "
                       f"{_PACKAGE_DIR.parent / 'cutlass_kernels'}); reinstall the package")


def cuda_sources(library: str = "prep") -> list[Path]:
    src = kernel_source_dir() / LIBRARIES[library]
    return sorted(p for p in src.iterdir() if p.suffix in (".cu", ".cpp"))


def _header_files() -> list[Path]:
    # Not tests/: the host-side check is not part of either library (nor of an installed wheel).
    root = kernel_source_dir()
    return sorted(p for p in root.rglob("*")
                  if p.suffix in (".h", ".cuh", ".hpp") and p.relative_to(root).parts[0] != "tests")


def _find_cutlass_include_dir() -> Path | None:
    override = os.environ.get("DDTREE_CUTLASS_DIR")  # a CUTLASS source tree (headers only), or its include/
    if override:
        for include in (Path(override) / "include", Path(override)):
            if (include / "cute").is_dir():
                return include
        return None
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.submodule_search_locations:
        include = Path(list(spec.submodule_search_locations)[0]) / "source" / "include"
        if (include / "cute").is_dir():
            return include
    return None


@functools.lru_cache(maxsize=None)
def cutlass_headers_available() -> bool:
    # Cached: "auto" asks on every call, and a module search plus a stat is not free on that path.
    return _find_cutlass_include_dir() is not None


def cutlass_include_dir() -> Path:
    """CUTLASS/CuTe headers from the installed `nvidia-cutlass` wheel (found without importing
    cutlass_library, which pulls heavy dependencies)."""
    include = _find_cutlass_include_dir()
    if include is None:
        raise RuntimeError(
            "ddtree_op: CUTLASS headers not found; install them with `pip install --no-deps nvidia-cutlass` "
            "(they ship under cutlass_library/source/include) or point DDTREE_CUTLASS_DIR at a CUTLASS source tree"
        )
    return include


def gpu_arch(device_index: int | None = None) -> str:
    """'90a' on Hopper (wgmma needs the arch-specific target), else e.g. '80'."""
    override = os.environ.get("DDTREE_CUDA_ARCH")
    if override:
        return override
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def cuda_build_flags(arch: str | None = None) -> dict[str, list[str]]:
    # No -std here: torch.utils.cpp_extension adds the standard its own headers need
    # (C++17 up to torch 2.12, C++20 from 2.13, whose headers use `requires`).
    arch = arch or gpu_arch()
    return {
        "cxx": ["-O3"],
        "nvcc": [
            "-O3",
            f"-gencode=arch=compute_{arch},code=sm_{arch}",  # names an arch: torch adds no other
            "--expt-relaxed-constexpr",
            "--expt-extended-lambda",
            "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-U__CUDA_NO_HALF2_OPERATORS__",
            "-lineinfo",
            *os.environ.get("DDTREE_NVCC_EXTRA", "").split(),  # e.g. -DDDTREE_WAIT_CLOCKS (part of the build key)
        ],
    }


def build_key(arch: str, library: str = "prep") -> str:
    digest = hashlib.sha256()
    digest.update(library.encode())
    for path in cuda_sources(library) + _header_files():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(repr(cuda_build_flags(arch)).encode())
    digest.update(f"{torch.__version__}|{torch.version.cuda}|{sys.version_info[:2]}".encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    root = os.environ.get("DDTREE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ddtree_op")
    return Path(root)


def include_dirs(library: str) -> list[str]:
    include = [str(kernel_source_dir())]
    if library == "sm90":
        include.append(str(cutlass_include_dir()))  # raises with the install hint when missing
    return include


def aot_module_name(library: str, arch: str) -> str:
    """The module name (ddtree_op.<name>) of a library built ahead of time by setup.py. It carries
    the build key, so a library built for another GPU arch, torch, flag set or source edit is never
    loaded: that case JIT-builds as if there were none."""
    return f"_aot_{library}_{build_key(arch, library)}"


AOT_DIR = _PACKAGE_DIR  # where setup.py's build_ext puts the ahead-of-time libraries


def _aot_library(library: str, arch: str) -> Path | None:
    found = sorted(AOT_DIR.glob(f"{aot_module_name(library, arch)}.*so"))
    if found:
        return found[0]
    if any(AOT_DIR.glob(f"_aot_{library}_*.so")):
        log.info("ddtree_op: the ahead-of-time %s library was built for another arch, torch, flags or sources; "
                 "JIT-building for sm_%s", library, arch)
    return None


def load_cuda_library() -> str:
    """The preparation kernels' library (torch.ops.ddtree_cuda.*), built on first use."""
    return load_library("prep")


def _notice(message: str) -> None:
    # A first-use build takes most of a minute and blocks the first CUDA call: say so on
    # stderr even where logging is not configured.
    log.info(message)
    print(message, file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=None)
def load_library(library: str) -> str:
    """Loads one of LIBRARIES: the ahead-of-time build when one matches, else the JIT build
    (compiled on first use, then from the cache); returns the path of the shared object."""
    arch = gpu_arch()
    if library == "sm90" and arch != "90a":
        raise RuntimeError(f"ddtree_op: the sm90 kernel needs an sm_90 GPU (Hopper); this one is sm_{arch}")
    if os.environ.get("DDTREE_FORCE_JIT", "0") != "1":
        aot = _aot_library(library, arch)
        if aot is not None:
            torch.ops.load_library(str(aot))
            log.info("ddtree_op: loaded the ahead-of-time %s library %s", library, aot)
            return str(aot)
    key = build_key(arch, library)
    name = f"ddtree_{library}_{key}"
    build_dir = cache_root() / f"sm{arch}" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    built = build_dir / f"{name}.so"
    with open(build_dir / "ddtree.flock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released by the kernel if this process dies
        stale = build_dir / "lock"
        if stale.exists():
            log.warning("ddtree_op: removing a stale build lock %s left by an interrupted build", stale)
            stale.unlink()
        if built.exists():
            # The directory's name is the key, a hash of the sources' contents: a library found
            # here is up to date. Loaded as it is, not through torch's `load`, which would rebuild
            # it (silently, most of a minute) whenever the sources sit at another path than
            # the build's (another checkout, an installed wheel or sdist sharing the cache).
            try:
                torch.ops.load_library(str(built))
                return str(built)
            except (OSError, RuntimeError) as exc:  # e.g. cut short by a killed link: build it again
                log.warning("ddtree_op: the cached %s library %s does not load (%s); rebuilding it", library, built, exc)
                built.unlink()
        from torch.utils.cpp_extension import is_ninja_available, load

        if not is_ninja_available():
            raise RuntimeError("ddtree_op: JIT-building the CUDA libraries needs ninja: `pip install ninja` (it comes "
                               "with the package's `cuda` extra)")
        include = include_dirs(library)  # raises with the install hint where sm90's CUTLASS headers are missing
        _notice(f"ddtree_op: JIT-compiling the {library} CUDA library for sm_{arch} (first use; cached in {build_dir})")
        start = time.perf_counter()
        flags = cuda_build_flags(arch)
        path = load(
            name=name,
            sources=[str(p) for p in cuda_sources(library)],
            extra_cflags=flags["cxx"],
            extra_cuda_cflags=flags["nvcc"],
            extra_include_paths=include,
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=os.environ.get("DDTREE_BUILD_VERBOSE", "0") == "1",
        )
        _notice(f"ddtree_op: built the {library} CUDA library in {time.perf_counter() - start:.1f} s")
    return str(path if path else built)
