"""Packaging: which files go into the wheel, and the optional ahead-of-time CUDA build.

The CUDA sources live in the repository's top-level `cutlass_kernels/` and are installed as
`ddtree_op/csrc/` (package data of `ddtree_op.csrc`), so the wheel adds no top-level package of its
own and leaves out `cutlass_kernels/tests/` (a host-side check that only the repository's tests
compile). The libraries are JIT-built on first CUDA use (ddtree_op/build.py); DDTREE_AOT_BUILD=1
compiles them here instead (see aot_extensions).
"""

import importlib.util
import os
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SOURCE_GLOBS = ["*.cu", "*.cuh", "*.cpp", "*.h", "*.hpp"]


def kernel_source_globs() -> list[str]:
    """package_data patterns for cutlass_kernels/ and each folder below it except tests/."""
    root = HERE / "cutlass_kernels"
    folders = [""] + sorted(f"{d.relative_to(root).as_posix()}/" for d in root.rglob("*")
                            if d.is_dir() and d.relative_to(root).parts[0] not in ("tests", "__pycache__"))
    return [folder + pattern for folder in folders for pattern in SOURCE_GLOBS]


def load_build_module():
    # By path, not `import ddtree_op.build`: importing the package would register its ops and pull
    # in every backend just to read the build flags.
    spec = importlib.util.spec_from_file_location("_ddtree_build", HERE / "ddtree_op" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CleanBuildPy(build_py):
    """pip builds a checkout in place and setuptools never empties build/lib, so a module renamed
    or deleted since the last build would still reach the wheel: start from an empty one."""

    def run(self):
        if not getattr(self, "editable_mode", False):
            for stale in ("ddtree_op", "cutlass_kernels"):
                shutil.rmtree(Path(self.build_lib) / stale, ignore_errors=True)
        super().run()


def aot_extensions():
    """DDTREE_AOT_BUILD=1: compile the libraries here (needs torch with CUDA and nvcc in the build
    environment, so `pip install --no-build-isolation .`; the arch comes from the visible GPU or
    DDTREE_CUDA_ARCH). The prep library always; the sm90 library too where the arch is 90a and
    the CUTLASS headers are found. Anything not built here is JIT-built on first use."""
    if os.environ.get("DDTREE_AOT_BUILD", "0") != "1":
        return {"cmdclass": {"build_py": CleanBuildPy}}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    build = load_build_module()
    arch = build.gpu_arch()
    flags = build.cuda_build_flags(arch)
    libraries = ["prep"]
    if arch != "90a":
        print(f"ddtree_op: DDTREE_AOT_BUILD: arch sm_{arch} is not sm_90a, so only the prep library is built")
    elif not build.cutlass_headers_available():
        print("ddtree_op: DDTREE_AOT_BUILD: no CUTLASS headers, so the sm90 library is left to the JIT build")
    else:
        libraries.append("sm90")
    extensions = [
        CUDAExtension(
            name=f"ddtree_op.{build.aot_module_name(library, arch)}",
            sources=[p.relative_to(HERE).as_posix() for p in build.cuda_sources(library)],  # setuptools wants relative paths
            include_dirs=build.include_dirs(library),
            extra_compile_args={"cxx": flags["cxx"], "nvcc": flags["nvcc"]},
        )
        for library in libraries
    ]
    return {"ext_modules": extensions, "cmdclass": {"build_ext": BuildExtension, "build_py": CleanBuildPy}}


setup(
    packages=find_packages(include=["ddtree_op", "ddtree_op.*"]) + ["ddtree_op.csrc"],
    package_dir={"ddtree_op.csrc": "cutlass_kernels"},
    package_data={"ddtree_op": ["py.typed"], "ddtree_op.csrc": kernel_source_globs()},
    **aot_extensions(),
)
