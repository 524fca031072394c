"""The CUDA build's pure-Python parts: sources per library, cache keys, shipped sources."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ddtree_op
from ddtree_op import build


def test_each_library_has_its_sources():
    prep = {p.name for p in build.cuda_sources("prep")}
    sm90 = {p.name for p in build.cuda_sources("sm90")}
    assert {"verify_indices.cu", "tree_mask.cu", "registration.cpp"} <= prep
    assert sm90 == {"tree_attention_sm90.cu"}


def test_build_key_depends_on_arch_and_library_and_is_stable():
    keys = {build.build_key(arch, lib) for arch in ("90a", "80") for lib in ("prep", "sm90")}
    assert len(keys) == 4
    assert build.build_key("90a", "sm90") == build.build_key("90a", "sm90")


def test_flags_target_the_arch_and_leave_the_standard_to_torch():
    nvcc = build.cuda_build_flags("90a")["nvcc"]
    assert "-gencode=arch=compute_90a,code=sm_90a" in nvcc
    assert not any(flag.startswith("-std=") for flag in nvcc + build.cuda_build_flags("90a")["cxx"])


def test_wheel_ships_every_kernel_source(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    if not (repo / "ddtree_op").is_dir():
        pytest.skip("no package source beside the tests to build a wheel from")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp_path), str(repo)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"could not build a wheel here: {result.stderr[-300:]}")
    (wheel,) = tmp_path.glob("ddtree_op-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = repo / "cutlass_kernels"
    shipped = [p for p in sources.rglob("*") if p.suffix in (".cu", ".cuh", ".cpp", ".h", ".hpp")
               and p.relative_to(sources).parts[0] != "tests"]
    assert shipped
    for source in shipped:
        relative = "ddtree_op/csrc/" + source.relative_to(sources).as_posix()
        assert relative in names, f"{relative} is not in the wheel"
    # Only the ddtree_op package: no top-level cutlass_kernels, no host-side test sources.
    assert {name.split("/")[0] for name in names} == {"ddtree_op", wheel.name.split("-")[0] + "-" + ddtree_op.__version__
                                                      + ".dist-info"}
    assert not any("layout_check" in name for name in names)
    assert "ddtree_op/py.typed" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)


def test_kernel_sources_are_found_in_the_checkout():
    assert (build.kernel_source_dir() / "registration.cpp").is_file()
