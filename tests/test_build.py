"""The CUDA build's pure-Python parts: sources per library, cache keys, shipped sources."""

import os
import re
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
    assert sm90 == ({"tree_attention_sm90.cu"}
                    | {f"verify_attention_{dtype}{cache}_{schedule}.cu" for dtype in ("bf16", "fp16") for cache in ("", "_fp8")
                       for schedule in ("split", "persistent")}
                    | {f"verify_attention_{dtype}_fp8_transposed.cu" for dtype in ("bf16", "fp16")})


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
    # An AOT library is named by the key setup.py computes from the checkout; the installed
    # package must compute the same key from its own copy of the sources, or it would never load.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import ddtree_op.build as b; print(b.kernel_source_dir()); "
             "print(*(b.aot_module_name(lib, arch) for lib in ('prep', 'sm90') for arch in ('90a', '80')))")
    installed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                               env=dict(os.environ, PYTHONPATH=str(site)), check=True).stdout.splitlines()
    assert installed[0] == str(site / "ddtree_op" / "csrc")
    assert installed[1].split() == [build.aot_module_name(lib, arch) for lib in ("prep", "sm90") for arch in ("90a", "80")]


def test_kernel_sources_are_found_in_the_checkout():
    assert (build.kernel_source_dir() / "registration.cpp").is_file()


def fake_jit_load(calls):
    def load(name, build_directory, **kwargs):
        calls.append(name)
        (Path(build_directory) / f"{name}.so").write_bytes(b"")

    return load


def test_jit_build_says_when_it_starts_and_how_long_it_took(tmp_path, monkeypatch, capsys):
    import torch
    import torch.utils.cpp_extension

    monkeypatch.setenv("DDTREE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DDTREE_CUDA_ARCH", "80")
    monkeypatch.setattr(build, "AOT_DIR", tmp_path / "no_aot")
    calls, loaded = [], []
    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_jit_load(calls))
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    built = build.load_library.__wrapped__("prep")
    err = capsys.readouterr().err
    assert "ddtree_op: JIT-compiling the prep CUDA library for sm_80 (first use; cached in" in err
    assert re.search(r"ddtree_op: built the prep CUDA library in \d+\.\d s", err)
    assert len(calls) == 1 and Path(built).parent.parent == tmp_path / "sm80"
    # Cached: loaded as it is, announced no more, and torch's `load` (which rebuilds a library
    # whose sources moved, e.g. a checkout's build loaded by an installed copy) is not called.
    assert build.load_library.__wrapped__("prep") == built
    assert capsys.readouterr().err == "" and len(calls) == 1 and loaded == [built]


def test_cached_library_that_does_not_load_is_rebuilt(tmp_path, monkeypatch, capsys):
    import torch
    import torch.utils.cpp_extension

    monkeypatch.setenv("DDTREE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DDTREE_CUDA_ARCH", "80")
    monkeypatch.setattr(build, "AOT_DIR", tmp_path / "no_aot")
    calls = []
    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_jit_load(calls))
    built = build.load_library.__wrapped__("prep")
    capsys.readouterr()

    def truncated(path):
        raise OSError(f"{path}: file too short")

    monkeypatch.setattr(torch.ops, "load_library", truncated)
    assert build.load_library.__wrapped__("prep") == built
    assert len(calls) == 2 and "JIT-compiling the prep CUDA library" in capsys.readouterr().err


def test_aot_library_is_loaded_only_where_its_key_matches(tmp_path, monkeypatch):
    import torch.utils.cpp_extension

    monkeypatch.setenv("DDTREE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DDTREE_CUDA_ARCH", "80")
    monkeypatch.setattr(build, "AOT_DIR", tmp_path)
    loaded, jit = [], []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_jit_load(jit))
    other = tmp_path / f"{build.aot_module_name('prep', '90a')}.cpython-311-x86_64-linux-gnu.so"
    other.write_bytes(b"")  # built for another arch: ignored
    build.load_library.__wrapped__("prep")
    assert loaded == [] and len(jit) == 1
    match = tmp_path / f"{build.aot_module_name('prep', '80')}.cpython-311-x86_64-linux-gnu.so"
    match.write_bytes(b"")
    assert build.load_library.__wrapped__("prep") == str(match) and loaded == [str(match)]
    monkeypatch.setenv("DDTREE_FORCE_JIT", "1")  # the AOT library ignored: the one JIT-built above, from the cache
    cached = build.load_library.__wrapped__("prep")
    assert cached != str(match) and loaded == [str(match), cached] and len(jit) == 1


def test_install_and_device_scripts_parse():
    repo = Path(__file__).resolve().parents[1]
    for script in ("bench/install_check.sh", "bench/device_validate.sh"):
        if not (repo / script).is_file():
            pytest.skip(f"no {script} beside the tests")
        result = subprocess.run(["bash", "-n", str(repo / script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
