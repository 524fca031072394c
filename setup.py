"""Packaging. The CUDA libraries are JIT-built on first use (ddtree_op/build.py); set
DDTREE_AOT_BUILD=1 to compile the preparation kernels ahead of time instead (needs torch with
CUDA and nvcc in the build environment: `pip install --no-build-isolation .`; the target arch
comes from the visible GPU or DDTREE_CUDA_ARCH). The sm_90a attention kernel is always JIT-built."""

import os
from glob import glob

from setuptools import setup


def aot_extensions():
    if os.environ.get("DDTREE_AOT_BUILD", "0") != "1":
        return {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    from ddtree_op.build import cuda_build_flags

    flags = cuda_build_flags()
    ext = CUDAExtension(
        name="ddtree_op._cuda_aot",
        # setuptools wants paths relative to this file: the prep library's sources, as build.py lists them
        sources=sorted(glob("cutlass_kernels/*.cu") + glob("cutlass_kernels/*.cpp")),
        include_dirs=[os.path.abspath("cutlass_kernels")],
        extra_compile_args={"cxx": flags["cxx"], "nvcc": flags["nvcc"]},
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


setup(**aot_extensions())
