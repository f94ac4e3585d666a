"""Query-rewriting analyses: raw vs rewritten tables, query shapes, length curves and their command line."""
import json

import pytest
from absl import app

from searchrl.eval import report
from searchrl.tasks.deepretrieval import analysis, rewrites


@pytest.mark.parametrize("query, shape", [
    ('(heart OR cardiac) AND "myocardial infarction"[tiab]', '(T OR T) AND "P"[tiab]'),
    ("statins stroke prevention", "T"),
    ('aspirin NOT "heart attack"', 'T NOT "P"'),
    ("(a OR b) AND (c OR d)", "(T OR T) AND (T OR T)"),
    ("diabetes[MeSH Terms] AND insulin", "T[MeSH Terms] AND T"),
    ("", ""),
])
def test_query_shapes_abstract_words_and_keep_structure(query, shape):
    assert rewrites.query_shape(query) == shape


def test_rewarded_shapes_count_only_rewarded_queries():
    rows = [{"query": "a OR b", "reward": 1.0}, {"query": "c OR d", "reward": 0.5},
            {"query": "e", "reward": 2.0}, {"query": "f OR g", "reward": 0.0}, {"query": "", "reward": 3.0}]
    assert rewrites.rewarded_shapes(rows) == [("T OR T", 2, 2 / 3), ("T", 1, 1 / 3)]


def test_report_puts_raw_and_rewritten_side_by_side():
    rows = [{"dataset": "nq", "hit@5": 1.0, "raw_hit@5": 0.0, "reward": 6.0},
            {"dataset": "nq", "hit@5": 0.0, "raw_hit@5": 0.0, "reward": -2.5},
            {"dataset": "tqa", "hit@5": 1.0, "raw_hit@5": 1.0, "reward": 6.0}]
    spec = analysis.REPORT
    results = report.aggregate(rows, spec=spec)
    assert results["raw_vs_rewritten"] == [
        {"dataset": "nq", "metric": "hit@5", "raw": 0.0, "rewritten": 0.5, "gain": 0.5},
        {"dataset": "tqa", "metric": "hit@5", "raw": 1.0, "rewritten": 1.0, "gain": 0.0},
        {"dataset": "average", "metric": "hit@5", "raw": 0.5, "rewritten": 0.75, "gain": 0.25}]
    assert "| nq | hit@5 | 0.000 | 0.500 | 0.500 |" in report.markdown(results, spec)
    assert report.aggregate([{"dataset": "nq", "em": 1.0}], spec=spec)["raw_vs_rewritten"] == []


def test_command_line_prints_shapes_and_length_curves(tmp_path, capsys):
    for name, queries in (("a", ["x y", "x"]), ("b", ["(x OR y) AND z", "(p OR q) AND r"])):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"query": q, "reward": 1.0}) + "\n" for q in queries))
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "env/reasoning_words": 10.0 + s, "env/query_words": 3.0 * s}) + "\n"
        for s in range(1, 4)))
    rewrites.main([f"--predictions={tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}",
                   f"--metrics={tmp_path / 'metrics.jsonl'}", f"--out={tmp_path / 'out'}"])
    out = capsys.readouterr().out
    assert "| (T OR T) AND T | 2 | 1.000 |" in out and "| T | 2 | 1.000 |" in out
    assert "| 3 | 13.000 | 9.000 |" in out
    assert (tmp_path / "out" / "rewrite_analysis.png").stat().st_size > 0
    with pytest.raises(app.UsageError, match="--predictions"):
        rewrites.main([])
