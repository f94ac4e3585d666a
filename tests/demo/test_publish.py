"""The miniatures' published figures: intervals over seeds (a textbook case), claims.json's table, and the
generated README block, docs/results.md and notebook blocks (regenerated from the record, and stale when a
figure is edited by hand)."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from searchrl.demo import publish, reproduce
from searchrl.demo.results import above, claim, interval, on_every_seed, paired, run_seeds, weakest

# Student-t 0.975 quantile with 4 degrees of freedom (statistical tables): 2.7764.
T_975_4 = 2.776445
T_975_2 = 4.302653  # and with 2 degrees of freedom


def test_interval_is_the_textbook_student_t_interval():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]  # mean 3, sample sd sqrt(2.5)
    half = T_975_4 * math.sqrt(2.5) / math.sqrt(5)
    got = interval(values)
    assert got["mean"] == 3.0 and got["n"] == 5
    assert got["low"] == pytest.approx(3.0 - half, abs=1e-6)
    assert got["high"] == pytest.approx(3.0 + half, abs=1e-6)
    assert interval([0.7]) == {"mean": 0.7, "low": None, "high": None, "n": 1}
    with pytest.raises(ValueError, match="one value per seed"):
        interval([])


def test_a_claim_is_shown_by_its_interval_never_by_its_mean():
    """[0.1, 0.2, 0.15]: mean 0.15, half width 4.303 * 0.05 / sqrt 3 = 0.124, interval [0.026, 0.274]."""
    shown = interval([0.1, 0.2, 0.15])
    assert shown["low"] == pytest.approx(0.15 - T_975_2 * 0.05 / math.sqrt(3))
    assert above(shown) == "yes" and above(shown, 0.02) == "yes"
    assert above(shown, 0.03) == "not shown"  # the mean clears 0.03, the lower end (0.026) does not
    assert above(shown, 0.16) == "no" and above(shown, 0.2) == "no"
    assert above(interval([-0.1, 0.2, 0.15])) == "not shown"  # mean 0.083, interval spans 0
    assert above(interval([0.3])) == "not shown"  # one seed: no interval
    kept = interval([-0.003, 0.01, -0.02])  # mean -0.0043, a "kept" margin of -0.01
    assert above(kept, -0.01) == "not shown" and above(interval([0.01, 0.02, 0.015]), -0.01) == "yes"
    assert on_every_seed([True, True]) == "yes" and on_every_seed([True, False]) == "no"
    assert weakest("yes", "not shown") == "not shown" and weakest("not shown", "no", "yes") == "no"
    assert weakest("yes", "yes") == "yes"
    made = claim("p", "c", "s", shown, "95% interval above 0", "not shown")
    assert made["verdict"] == "not shown" and made["holds"] is False
    with pytest.raises(ValueError, match="verdict 'maybe'"):
        claim("p", "c", "s", shown, "t", "maybe")


def test_paired_difference_is_per_seed():
    per_seed = {"0": {"rl": {"r": 0.5}, "sft": {"r": 0.1}}, "1": {"rl": {"r": 0.4}, "sft": {"r": 0.2}}}
    gain = paired(per_seed, "rl", "sft", "r")
    assert gain["per_seed"] == {"0": pytest.approx(0.4), "1": pytest.approx(0.2)}
    assert gain["mean"] == pytest.approx(0.3) and gain["n"] == 2


def pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def test_seeds_side_by_side_give_what_one_after_another_gives():
    alone = run_seeds(pid_and_square, [3, 1, 4], processes=1)
    side_by_side = run_seeds(pid_and_square, [3, 1, 4], processes=2)
    assert [r for _, r in side_by_side] == [r for _, r in alone] == [9, 1, 16]  # in the jobs' order
    assert {pid for pid, _ in alone} == {os.getpid()}
    assert os.getpid() not in {pid for pid, _ in side_by_side}
    with pytest.raises(ValueError, match="processes must be >= 1"):
        run_seeds(pid_and_square, [3], processes=0)


def record(root: Path, recall_gains: list[float]) -> dict:
    """A record as `make reproduce` + `publish --claims` leave it: claims.json and one results.json."""
    gain = {"per_seed": {str(i): g for i, g in enumerate(recall_gains)}, **interval(recall_gains)}
    claims = {"all_hold": True,
              "papers": {"deepretrieval": {"preset": "configs.deepretrieval:tiny", "wall_s": 600.0,
                                           "results": "unused", "workdir": "unused",
                                           "seeds": list(range(len(recall_gains))), "date": "2026-12-03",
                                           "commit": "0123456789abcdef", "machine": "x86_64, 2 CPU cores"}},
              "claims": [claim("deepretrieval", "rl_beats_cold_start_recall@10", "RL - cold start recall@10",
                               gain, ">= 0.20 on every seed",
                               on_every_seed(g >= 0.2 for g in recall_gains))]}
    (root / publish.MINIATURES).mkdir(parents=True)
    (root / publish.RECORD / "claims.json").write_text(json.dumps(claims))
    per_seed = {str(i): {"rl": {"recall@10": r}} for i, r in enumerate([0.45, 0.5, 0.55])}
    over_seeds = {"rl": {"recall@10": interval([0.45, 0.5, 0.55])}}
    (root / publish.MINIATURES / "deepretrieval.json").write_text(json.dumps({"held_out": per_seed,
                                                                             "over_seeds": over_seeds}))
    return claims


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The files publish writes into, copied from this checkout, with an empty record."""
    for path in publish.blocks():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(publish.ROOT / path, tmp_path / path)
    return tmp_path


def test_generated_files_state_the_record_and_go_stale_when_edited(checkout):
    record(checkout, [0.37, 0.41, 0.47])
    for path, text in publish.generated(checkout).items():
        (checkout / path).write_text(text)
    assert publish.stale(checkout) == []
    readme = (checkout / "README.md").read_text()
    row = ("| deepretrieval | RL - cold start recall@10 | 0.417 [0.292, 0.542], 3 seeds "
           "| >= 0.20 on every seed | yes |")
    assert row in readme
    assert ("deepretrieval: measured 2026-12-03 at commit 0123456789ab on x86_64, 2 CPU cores, "
            "seeds 0, 1, 2, 10 min.") in readme
    notebook = json.loads((checkout / "notebooks/03_deepretrieval.ipynb").read_text())
    assert row in "".join(notebook["cells"][0]["source"])
    rpl = json.loads((checkout / "notebooks/04_rpl.ipynb").read_text())
    assert "Not measured yet for rpl" in "".join(rpl["cells"][0]["source"])
    page = (checkout / publish.RESULTS_PAGE).read_text()
    assert "| rl | recall@10 | 0.500 [0.376, 0.624] | 3 |" in page and "10 min." in page
    assert "| 2 | rl | recall@10 | 0.550 |" in page

    (checkout / "README.md").write_text(readme.replace("0.417 [0.292", "0.420 [0.292"))  # typed by hand
    assert publish.stale(checkout) == [Path("README.md")]


def test_a_file_without_its_block_is_named(checkout):
    (checkout / "README.md").write_text("# no block\n")
    with pytest.raises(ValueError, match=r"README.md: no '<!-- generated: claims -->'"):
        publish.generated(checkout)


def test_the_committed_figures_are_the_generated_ones():
    """README.md, docs/results.md and the notebooks state what docs/results/ records (or that nothing is
    recorded yet): `python -m searchrl.demo.publish --check`."""
    assert publish.stale(publish.ROOT) == []


def test_claims_table_states_failures():
    one_seed = {"per_seed": {"0": 0.01}, **interval([0.01])}
    failing = claim("rpl", "b", "mutation gain", one_seed, "95% interval above 0.02", above(one_seed, 0.02))
    unshown = claim("rpl", "b", "mutation gain", one_seed, "95% interval above 0", above(one_seed))
    shown = claim("rpl", "a", "programs win", {"per_seed": {"0": True}}, "on every seed", on_every_seed([True]))
    table = reproduce.claims_table([failing, unshown, shown])
    assert "| rpl | mutation gain | 0.010 (1 seed) | 95% interval above 0.02 | **no** |" in table
    assert "| rpl | mutation gain | 0.010 (1 seed) | 95% interval above 0 | **not shown** |" in table
    assert "| rpl | programs win | 1 of 1 seeds | on every seed | yes |" in table
    assert reproduce.verdict_counts([failing, unshown, shown]) == (
        "1 of 3 claims shown, 1 not shown (the mean alone), 1 failing")
    several = {"extra_em_loss": interval([0.1, 0.3]), "one_hop_drop": {"a": 0.4, "b": 0.5}, "drop_gap": 0.1}
    assert reproduce.measured_text(several) == (
        "extra_em_loss 0.200 [-1.071, 1.471], 2 seeds; one_hop_drop a 0.400; b 0.500; drop_gap 0.100")


def test_a_paper_run_again_replaces_only_its_own_record(tmp_path, monkeypatch):
    """reproduce keeps the other papers' entries and claims in claims.json and replaces the rerun one's."""
    old = {"papers": {"rpl": {"seeds": [0]}, "deepretrieval": {"seeds": [9]}}, "all_hold": False,
           "claims": [claim("rpl", "a", "s", {}, "t", "yes"),
                      claim("deepretrieval", "b", "s", {}, "t", "no")]}
    reproduce.write(old, str(tmp_path))
    monkeypatch.setattr(reproduce, "miniature_config", lambda paper, seeds, out: type(
        "Config", (), {"task": paper, "workdir": str(tmp_path / paper)})())
    fresh = claim("deepretrieval", "b", "s", {}, "t", "yes")
    monkeypatch.setattr(reproduce.miniature, "run", lambda config: {"claims": [fresh]})
    report = reproduce.reproduce(["deepretrieval"], [0, 1], str(tmp_path))
    assert report == json.loads((tmp_path / "claims.json").read_text())
    assert report["claims"] == [old["claims"][0], fresh] and report["all_hold"]
    assert report["papers"]["rpl"] == {"seeds": [0]} and report["papers"]["deepretrieval"]["seeds"] == [0, 1]


# Where the miniatures' results are described; a figure of theirs appears there only inside a generated block.
DESCRIBED_IN = ("README.md", "docs/autosearch.md", "docs/deepretrieval.md", "docs/rpl.md",
                "notebooks/README.md",
                *(f"notebooks/{p.name}" for p in sorted((publish.ROOT / "notebooks").glob("*.ipynb"))))
RESULT_LINE = re.compile(r"\b(EM|F1|dF1|recall|NDCG|searches|exact match)\b.*\b\d\.\d{2,}|"
                         r"\b\d\.\d{2,}\b.*\b(EM|F1|dF1|recall|NDCG|searches|exact match)\b|"
                         r"^\|.*\b\d\.\d{2,}\b.*\|.*\b\d\.\d{2,}\b", re.I)  # or a table row of figures


def prose(path: Path) -> str:
    """A file's text (a notebook's markdown cells) without its generated blocks."""
    text = path.read_text()
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.sub(r"<!-- generated: .*? -->\n.*?<!-- end generated -->", "", text, flags=re.S)


@pytest.mark.parametrize("name", DESCRIBED_IN)
def test_no_miniature_figure_is_typed_by_hand(name):
    """A line stating a metric with a decimal figure, outside a generated block, is a figure typed by hand (a
    row of a table of presets or reward formulas, its first cell a name in code, states settings instead)."""
    typed = [line for line in prose(publish.ROOT / name).splitlines()
             if RESULT_LINE.search(line) and not line.startswith("| `")]
    assert not typed, f"{name}: figures typed by hand (searchrl.demo.publish generates them):\n" + \
        "\n".join(typed)


def test_a_typed_figure_is_seen():
    for line in ("PPO cuts 1-hop searches by 23% (2.05 to 1.58)", "recall@10 of the RL policy 0.41 and 0.51",
                 "| 0 | program | 0.403 | 0.340 |"):
        assert RESULT_LINE.search(line)
    assert not RESULT_LINE.search("KL 0.001 in the reward, lr 1e-6")
