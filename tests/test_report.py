"""bench/report.py's README part: generated from a results folder, between the markers only."""

import json

from bench import report


def small_run(tmp_path):
    def row(case, tags, sm90, triton, baseline):
        return {"case": case, "tags": tags, "heads": 16, "batch": 2, "draft": 4, "prefix_max": 4096, "flops": 1e9,
                "bytes": 1e8, "floor_us": 30.0, "input_sets": 1,
                "time_us": {"cutlass": sm90, "triton": triton, "sglang_baseline": baseline, "step[cutlass]": sm90 + 1},
                "sol_fraction": {"cutlass": 30.0 / sm90, "triton": 30.0 / triton, "sglang_baseline": 30.0 / baseline},
                "speedup_vs_baseline": {"cutlass": baseline / sm90, "triton": baseline / triton}}

    results = {"meta": {"date": "2026-01-01", "gpu": "NVIDIA H200", "commit": "abc1234", "torch": "2.11.0",
                        "ceilings": {"copy_bytes_per_s": 4.2e12, "bf16_flops": 7.8e14}},
               "rows": [row("H16_n4_B2_P4096", ["grid"], 60.0, 120.0, 600.0),
                        row("dsv3_H16_chain4_B2_P4k", ["serving"], 50.0, 100.0, 900.0)]}
    run = tmp_path / "bench" / "results" / "2026-01-01_H200_abc1234"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(results))
    (run / "gpu_tests.log").write_text("....\n12 passed, 3 skipped, 2 deselected, 1 warning in 10.50s\n")
    return run, results


def test_readme_part_names_its_run_and_replaces_only_the_marked_part(tmp_path):
    run, results = small_run(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\nbefore\n\n{report.README_BEGIN}\nold numbers\n{report.README_END}\n\nafter\n")
    report.update_readme(readme, report.readme_section(run, results, tmp_path))
    text = readme.read_text()
    assert "old numbers" not in text and text.startswith("# t\n\nbefore\n") and text.endswith("\nafter\n")
    assert "`bench/results/2026-01-01_H200_abc1234/`" in text and "commit abc1234" in text
    assert "GPU tests of that commit: 12 passed, 3 skipped" in text
    assert "| sm90 | 0.500 | 10.0× |" in text  # the old backend name is shown as today's
    assert "| dsv3_H16_chain4_B2_P4k | 16 | 2 | 4 | 4096 | 50.0 | 100.0 | 900.0 | 51.0 |" in text
    # Regenerating is idempotent.
    report.update_readme(readme, report.readme_section(run, results, tmp_path))
    assert readme.read_text() == text
