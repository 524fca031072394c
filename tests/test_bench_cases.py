"""Pure-Python parts of the benchmark: floors and the case generator (no GPU needed)."""

import math

import pytest

from bench.cases import Case, all_cases, geomean, grid_cases, ragged, ragged_cases, serving_cases
from bench.verify import L2_BYTES, input_set_count, parse_triton_configs


def test_grid_is_the_35_shapes_of_the_kernel_notes():
    grid = grid_cases()
    assert len(grid) == 35 and len({c.name for c in grid}) == 35
    assert {c.heads for c in grid} == {16, 128}
    assert {c.draft_lens[0] for c in grid} == {4, 16, 64}
    assert {c.batch for c in grid} == {1, 8, 32}
    assert {c.prefix_lens[0] for c in grid} == {1024, 8192}


def test_flops_and_bytes_by_hand():
    case = Case("x", heads=16, prefix_lens=(1024,), draft_lens=(4,))
    assert case.flops() == 2 * 1088 * 16 * 4 * 1028
    assert case.bytes() == 1028 * (1152 + 4) + 64 * (1152 + 1028)


def test_floor_is_the_larger_of_compute_and_memory_time():
    compute_bound = Case("c", 128, (8192,) * 8, (64,) * 8)
    memory_bound = Case("m", 16, (8192,) * 8, (1,) * 8)
    assert compute_bound.floor_seconds(797e12, 4.2e12) == pytest.approx(compute_bound.flops() / 797e12)
    assert memory_bound.floor_seconds(797e12, 4.2e12) == pytest.approx(memory_bound.bytes() / 4.2e12)


@pytest.mark.parametrize("prefix,batch", [(1024, 8), (8192, 32), (1000, 3)])
def test_ragged_keeps_total_and_spans_three_times(prefix, batch):
    lens = ragged(prefix, batch)
    assert sum(lens) == prefix * batch and len(lens) == batch
    assert max(lens) / min(lens) == pytest.approx(3, rel=0.05)


def test_case_lists_are_consistent():
    assert len(ragged_cases()) == sum(1 for c in grid_cases() if c.batch > 1)
    assert all(c.heads in (16, 128) for c in serving_cases())
    assert len(all_cases()) == len(grid_cases()) + len(ragged_cases()) + len(serving_cases())


def test_geomean_and_config_parsing():
    assert geomean([1, 4, 16]) == pytest.approx(4)
    assert math.isnan(geomean([]))
    configs = parse_triton_configs("64,64,8,1;64,32,4,1,2")
    assert configs["triton[64x64w8s1]"] == dict(block_m=64, block_n=64, num_warps=8, num_stages=1, dv_parts=1)
    assert configs["triton[64x32w4s1v2]"]["dv_parts"] == 2


def test_input_sets_cover_three_l2_caches():
    for case in all_cases():
        sets = input_set_count(case)
        assert 1 <= sets <= 8
        assert sets == 8 or sets * case.bytes() >= 3 * L2_BYTES


def test_parallel_tests_deal_every_id_once_and_keep_the_grouped_ones_together():
    from bench.parallel_tests import deal, summary_line, totals

    ids = [f"tests/test_a.py::test_x[{i}]" for i in range(10)] + [f"tests/test_b.py::test_cpu_in_subprocess[{i}]" for i in range(3)]
    shares = deal(ids, 4, ["cpu_in_subprocess"])
    assert sorted(sum(shares, [])) == sorted(ids)
    assert shares[0] == [i for i in ids if "cpu_in_subprocess" in i]
    assert [len(s) for s in shares[1:]] == [4, 3, 3]
    assert deal(ids[:10], 3, ["cpu_in_subprocess"]) == [ids[0:10:3], ids[1:10:3], ids[2:10:3]]
    assert deal(ids, 1, ["cpu_in_subprocess"]) == [ids[10:] + ids[:10]]
    assert totals("3 failed, 147 passed, 1 skipped, 1 error, 14 warnings in 404.15s") == {
        "failed": 3, "passed": 147, "skipped": 1, "errors": 1}
    assert summary_line(["....", "== 2 passed, 1 skipped in 3.10s ==", "Exception ignored in: <atexit>"]) == \
        "== 2 passed, 1 skipped in 3.10s =="
    assert summary_line(["!!! KeyboardInterrupt !!!", "no tests ran in 3.22s"]) == "no tests ran in 3.22s"


def test_compare_runs_divides_shape_by_shape_against_the_first_run(tmp_path, capsys):
    import json

    from bench.compare_runs import main

    def run(name, times):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"rows": [{"case": c, "time_us": t} for c, t in times.items()]}))
        return f"{name}={path}"

    base = run("base", {"A": {"sm90": 10.0, "flashmla": 5.0}, "B": {"sm90": 40.0, "flashmla": 20.0}})
    variant = run("new", {"A": {"sm90": 20.0, "flashmla": 5.0}, "B": {"sm90": 10.0, "flashmla": 20.0}})
    main([base, variant, "--columns", "sm90"])
    out = capsys.readouterr().out
    assert "sm90: base / FlashMLA 2.000 (worst 2.000)" in out
    assert "sm90: new / base 0.7071 (0.250-2.000, 2 shapes)" in out  # sqrt(2 * 0.25)
    assert "sm90: new / FlashMLA 1.414 (worst 4.000)" in out
