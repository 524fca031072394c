"""Packaging. The CUDA libraries are JIT-built on first use (ddtree_op/build.py); set
DDTREE_AOT_BUILD=1 to compile the preparation kernels ahead of time instead (needs torch with
CUDA and nvcc in the build environment: `pip install --no-build-isolation .`; the target arch
comes from the visible GPU or DDTREE_CUDA_ARCH). The sm_90a attention kernel is always JIT-built."""

import os

from setuptools import setup


def aot_extensions():
    if os.environ.get("DDTREE_AOT_BUILD", "0") != "1":
        return {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    from ddtree_op.build import cuda_build_flags, cuda_sources, kernel_source_dir

    flags = cuda_build_flags()
    ext = CUDAExtension(
        name="ddtree_op._cuda_aot",
        sources=[str(p) for p in cuda_sources()],
        include_dirs=[str(kernel_source_dir())],
        extra_compile_args={"cxx": flags["cxx"], "nvcc": flags["nvcc"]},
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


setup(**aot_extensions())
