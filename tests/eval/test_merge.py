"""`python -m searchrl.eval.merge`: evaluation runs written by the report's own writer merge into the main
table (EM and mean searches per dataset, one row per method, with each run's split and question counts),
computed here by hand; runs of other splits or question counts are refused unless asked for."""
from __future__ import annotations

import csv
import json

import pytest

from searchrl import task
from searchrl.eval import merge, report

MAIN = task.get("autosearch").report.main_table  # AutoSearch's main table: EM and mean searches


def rows(dataset: str, em: list[float], searches: list[int]) -> list[dict]:
    return [{"dataset": dataset, "id": f"{dataset}{i}", "answer": "x", "em": e, "f1": e, "searches": s}
            for i, (e, s) in enumerate(zip(em, searches))]


def write_run(directory, question_rows: list[dict], split: str = "test") -> None:
    report.write_report({"meta": {"split": split}, **report.aggregate(question_rows),
                         "predictions": question_rows}, directory)


@pytest.fixture
def runs(tmp_path):
    """Three evaluation directories of the test split: two on NQ and HotpotQA, one on NQ only."""
    questions = {
        "autosearch": rows("nq", [1, 0], [1, 3]) + rows("hotpotqa", [1, 1, 0, 0], [2, 2, 3, 1]),
        "stepsearch": rows("nq", [1, 1], [0, 1]) + rows("hotpotqa", [0, 0, 0, 1], [4, 4, 4, 4]),
        "hiprag": rows("nq", [0, 0], [2, 2]),
    }
    dirs = {}
    for method, question_rows in questions.items():
        dirs[method] = tmp_path / method
        write_run(dirs[method], question_rows)
    return dirs


def test_merge_by_hand(runs):
    merged = merge.merge([(m, merge.load_results(d)) for m, d in runs.items()], MAIN)
    assert merged["datasets"] == ["nq", "hotpotqa"] and merged["metrics"] == ["em", "searches"]
    auto, step, hip = merged["rows"]
    # autosearch: nq EM 1/2, 2 searches; hotpotqa EM 2/4, 2 searches; averages over the 2 datasets.
    assert auto["cells"] == {"nq": {"em": 0.5, "searches": 2.0}, "hotpotqa": {"em": 0.5, "searches": 2.0}}
    assert auto["average"] == {"em": 0.5, "searches": 2.0} and auto["n"] == {"nq": 2, "hotpotqa": 4}
    assert step["cells"] == {"nq": {"em": 1.0, "searches": 0.5}, "hotpotqa": {"em": 0.25, "searches": 4.0}}
    assert step["average"] == {"em": 0.625, "searches": 2.25}
    # hiprag has no hotpotqa: empty cells and no average (never one over other datasets).
    assert hip["cells"]["hotpotqa"] == {"em": None, "searches": None}
    assert hip["average"] == {"em": None, "searches": None}
    assert hip["cells"]["nq"] == {"em": 0.0, "searches": 2.0}
    assert [row["split"] for row in merged["rows"]] == ["test"] * 3 and merged["differences"] == []


def test_the_command_writes_markdown_csv_and_json(runs, tmp_path, capsys):
    out = tmp_path / "table"
    merge.main([f"--run={m}={d}" for m, d in runs.items()] + [f"--out={out}", "--task=autosearch"])
    expected_md = (
        "| method | split | nq n | nq EM | nq searches | hotpotqa n | hotpotqa EM | hotpotqa searches "
        "| average EM | average searches |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        "| autosearch | test | 2 | 0.500 | 2.000 | 4 | 0.500 | 2.000 | 0.500 | 2.000 |\n"
        "| stepsearch | test | 2 | 1.000 | 0.500 | 4 | 0.250 | 4.000 | 0.625 | 2.250 |\n"
        "| hiprag | test | 2 | 0.000 | 2.000 |  |  |  |  |  |\n")
    assert (out / "main_table.md").read_text() == expected_md
    assert expected_md in capsys.readouterr().out
    with open(out / "main_table.csv") as f:
        table = list(csv.reader(f))
    assert table[0] == ["method", "split", "nq/n", "nq/em", "nq/searches", "hotpotqa/n", "hotpotqa/em",
                        "hotpotqa/searches", "average/em", "average/searches"]
    assert table[2] == ["stepsearch", "test", "2", "1.0", "0.5", "4", "0.25", "4.0", "0.625", "2.25"]
    assert table[3] == ["hiprag", "test", "2", "0.0", "2.0", "", "", "", "", ""]
    saved = json.loads((out / "main_table.json").read_text())
    assert saved == merge.merge([(m, merge.load_results(d / "results.json")) for m, d in runs.items()], MAIN)


def test_other_metrics_and_errors(runs, tmp_path, capsys):
    merged = merge.merge([("a", merge.load_results(runs["autosearch"]))], ["f1"])
    header = "| method | split | nq n | nq F1 | hotpotqa n | hotpotqa F1 | average F1 |"
    assert merge.markdown(merged).splitlines()[0] == header
    with pytest.raises(ValueError, match="a method is named twice"):
        merge.merge([("a", merge.load_results(runs["hiprag"]))] * 2, MAIN)
    with pytest.raises(SystemExit):
        merge.main([f"--run=nodir={tmp_path / 'missing'}", f"--out={tmp_path / 'o'}", "--task=autosearch"])
    assert "no results.json at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        merge.main([f"--run={runs['hiprag']}", f"--out={tmp_path / 'o'}", "--task=autosearch"])
    assert "expected METHOD=DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the columns come from the task or from --metrics
        merge.main([f"--run=a={runs['hiprag']}", f"--out={tmp_path / 'o'}"])
    assert "pass --task (its main table's metrics) or --metrics" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ValueError, match="bad.json: not an evaluation's results"):
        merge.load_results(tmp_path / "bad.json")


def test_runs_of_another_split_or_question_count_are_refused_unless_asked_for(runs, tmp_path, capsys):
    """Issue 67, cause 15: a full test split beside a 10-question dev split was averaged with no warning."""
    ten = rows("nq", [1] * 10, [1] * 10) + rows("hotpotqa", [1] * 10, [1] * 10)
    write_run(tmp_path / "dev10", ten, "dev")
    specs = [f"--run=autosearch={runs['autosearch']}", f"--run=quick={tmp_path / 'dev10'}", "--task=autosearch"]
    with pytest.raises(SystemExit) as exit_info:
        merge.main([*specs, f"--out={tmp_path / 'refused'}"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and len(err.splitlines()) == 1, err
    assert ("the runs are not comparable (split: test (autosearch) vs dev (quick); nq n: 2 (autosearch) vs "
            "10 (quick); hotpotqa n: 4 (autosearch) vs 10 (quick)): evaluate them on the same split") in err
    assert not (tmp_path / "refused").exists()

    merge.main([*specs, f"--out={tmp_path / 'table'}", "--allow_incomparable"])
    out, err = capsys.readouterr()
    assert err.startswith("WARNING: these runs are not comparable (split: test (autosearch) vs dev (quick)")
    table = (tmp_path / "table" / "main_table.md").read_text()
    assert table.startswith("**WARNING: these runs are not comparable") and table in out + "\n"
    assert "| quick | dev | 10 | 1.000 | 1.000 | 10 | 1.000 |" in table
    saved = json.loads((tmp_path / "table" / "main_table.json").read_text())
    assert saved["differences"][0].startswith("split: test (autosearch) vs dev (quick)")


def test_a_metric_that_is_not_a_number_is_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"autosearch: nq answer='x' is not a number"):
        merge.merge([("autosearch", {"table": [{"dataset": "nq", "n": 2, "answer": "x"}]})], ["answer"])
    (tmp_path / "strings" / "results.json").parent.mkdir()
    (tmp_path / "strings" / "results.json").write_text(json.dumps(
        {"table": [{"dataset": "nq", "n": 2, "em": "0.5"}]}))
    with pytest.raises(SystemExit) as exit_info:
        merge.main([f"--run=a={tmp_path / 'strings'}", f"--out={tmp_path / 'o'}", "--task=autosearch"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.startswith("error: a: nq em='0.5' is not a number: --metrics names numeric columns")
    assert len(err.splitlines()) == 1
    (tmp_path / "strings" / "results.json").write_text('{"table": [')
    with pytest.raises(ValueError, match=r"results.json: not JSON"):
        merge.load_results(tmp_path / "strings")
