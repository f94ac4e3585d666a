"""The rollout benchmark's published figures are the ones its results files give."""
from __future__ import annotations

import json

import pytest

from searchrl.benchmarks import rollout_report


def test_the_docs_quote_the_results_files():
    root = rollout_report.ROOT
    assert rollout_report.generated(root) == (root / rollout_report.DOCS).read_text(), (
        "run `python -m searchrl.benchmarks.rollout_report`")


def test_each_part_reads_its_own_figures():
    results = {
        "s": {"decode_scaling_preset": "tiny", "decode_scaling_slots": [512, 8192], "decode_scaling_ms_per_step": [0.5, 0.75],
              "decode_scaling_rows": 16, "decode_scaling_live": 100, "decode_scaling_cost_ratio": 1.5,
              "decode_scaling_cost_ratio_range": [1.25, 2.0]},
        "d": {"long_tail_calls_mix": [0.5, 0.25, 0.125, 0.125], "long_tail_continuous_episodes_per_s": 3.0,
              "long_tail_continuous_utilisation": 0.9, "long_tail_lockstep_episodes_per_s": 2.0,
              "long_tail_lockstep_utilisation": 0.6, "long_tail_continuous_idle_share": 0.05,
              "long_tail_lockstep_idle_share": 0.25, "long_tail_ratio": 1.5, "long_tail_ratio_min": 1.25,
              "long_tail_ratio_max": 1.75, "long_tail_rounds": 3, "long_tail_compiles_after_warmup": 0},
        "i": {"answers_tokens": 8, "answers_per_rollout": 40, "answers_answers_episodes_per_s": 1.5,
              "answers_answers_utilisation": 0.875, "answers_plain_episodes_per_s": 2.0,
              "answers_plain_utilisation": 0.9, "answers_ratio": 0.75, "answers_ratio_min": 0.5,
              "answers_ratio_max": 1.0, "answers_rounds": 3},
    }
    for r in results.values():
        r |= {"device": "cpu (test)", "dtype": "float32"}
    lines = rollout_report.render(results).splitlines()
    assert "(tiny preset) of 16 rows holding 100 live tokens" in lines[0]
    assert "0.50 ms with 512 slots a row and 0.75 ms with 8192: 1.50x (range 1.25-2.00)" in lines[0]
    assert "mix 50%/25%/12%/12%" in lines[2] and "3.00 episodes/s at 90.0%" in lines[2]
    assert "lock step 2.00 at 60.0% (idle 25.0%)" in lines[2] and "1.50x (range 1.25-1.75 over 3" in lines[2]
    assert "(device idle waiting for the host at most 5.0%)" in lines[2]
    assert "8 tokens after each search, 40 a rollout" in lines[4] and "1.50 episodes/s at 87.5%" in lines[4]
    assert "2.00 at 90.0% without them: 0.75x (range 0.50-1.00" in lines[4]
    assert lines[5].startswith("  (cpu (test), float32; `python -m searchrl.benchmarks.rollout --parts i")


def test_a_docs_file_without_the_block_is_named(tmp_path):
    for part, path in rollout_report.FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(json.dumps(json.loads((rollout_report.ROOT / path).read_text())))
    (tmp_path / "docs" / "benchmarks.md").write_text("no block here\n")
    with pytest.raises(ValueError, match="docs/benchmarks.md: no '<!-- generated: rollout -->'"):
        rollout_report.generated(tmp_path)
