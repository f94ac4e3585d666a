"""AutoSearch's over-/under-search table: minimal depths from a pilot's rows, rates checked by hand."""
import pytest

from searchrl.tasks.autosearch import search_rates
from tests.data.retrieval_helpers import write_jsonl


def pilot_rows(model, right_at):
    """A pilot's predictions: question id -> the forced depths (of 0..2) whose answer is right."""
    return [{"model": model, "forced_depth": k, "dataset": "nq", "id": q, "hops": None, "em": float(k in ks)}
            for k in range(3) for q, ks in right_at.items()]


def test_over_and_under_search_rates_by_hand(tmp_path, capsys):
    # minimal depths: a -> 1, b -> 0, c -> 2, d -> never (for model big; small's differ)
    write_jsonl(tmp_path / "pilot.jsonl", pilot_rows("big", {"a": {1, 2}, "b": {0}, "c": {2}, "d": set()})
                + pilot_rows("small", {"a": {0}, "b": {0}, "c": {0}, "d": {0}}))
    deep = [{"dataset": "nq", "id": q, "searches": s} for q, s in (("a", 3), ("b", 1), ("c", 2), ("d", 4))]
    shallow = [{"dataset": "nq", "id": q, "searches": s} for q, s in (("a", 0), ("b", 0), ("c", 1), ("d", 0))]
    write_jsonl(tmp_path / "deep.jsonl", deep)
    write_jsonl(tmp_path / "shallow.jsonl", shallow)
    search_rates.main(["--pilot", str(tmp_path / "pilot.jsonl"), "--pilot_model", "big", "--runs",
                       f"search_r1={tmp_path / 'deep.jsonl'},hiprag={tmp_path / 'shallow.jsonl'}",
                       "--out", str(tmp_path / "rates.md")])
    table = capsys.readouterr().out
    assert table == (tmp_path / "rates.md").read_text()
    # deep: a 3 > 1 over, b 1 > 0 over, c 2 = 2, d never -> over 2/3, under 0; shallow: a 0 < 1, c 1 < 2 under.
    assert "| search_r1 | nq | 4 | 0.667 | 0.000 | 2.500 | 1 |" in table
    assert "| hiprag | all | 4 | 0.000 | 0.667 | 0.250 | 1 |" in table
    with pytest.raises(ValueError, match=r"no rows of model 'mid'; it has \['big', 'small'\]"):
        search_rates.pilot_depths(pilot_rows("big", {"a": {1}}) + pilot_rows("small", {"a": set()}), "mid")
    with pytest.raises(ValueError, match=r"1 evaluated questions are not in the pilot, first \('nq', 'z'\)"):
        search_rates.rates([{"dataset": "nq", "id": "z", "searches": 0}], {("nq", "a"): 1})
