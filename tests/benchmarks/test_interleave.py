"""Interleaved timing: the order of the runs, the per-round ratios and the verdict, on a scripted clock."""
import pytest

from searchrl.benchmarks.interleave import Comparison, compare, describe


class Script:
    """A clock that advances by the duration each call of a side is scripted to take, and a log of calls."""

    def __init__(self, durations: dict[str, list[float]]):
        self.now, self.durations, self.log = 0.0, {k: list(v) for k, v in durations.items()}, []

    def side(self, name: str):
        def call():
            self.log.append(name)
            self.now += self.durations[name].pop(0)
        return call

    def clock(self) -> float:
        return self.now


def test_runs_alternate_and_each_round_gives_a_ratio():
    # Warm-up (ignored: 100 s of compilation), then 3 rounds of 2 calls per side; round 2 hit a load spike.
    script = Script({"ours": [100, 1, 1, 4, 4, 1, 1], "peer": [100, 2, 2, 8, 8, 2, 2]})
    result = compare(script.side("ours"), script.side("peer"), rounds=3, calls=2, clock=script.clock)
    assert script.log == ["ours", "peer"] + ["ours", "ours", "peer", "peer"] * 3
    assert result == Comparison((1.0, 4.0, 1.0), (2.0, 8.0, 2.0))
    assert result.ratios == [2.0, 2.0, 2.0] and result.conclusive  # the spike slowed both sides alike
    summary = result.summary("step")
    assert summary == {"step_ratio": 2.0, "step_ratio_min": 2.0, "step_ratio_max": 2.0,
                       "step_conclusive": True, "step_rounds": 3, "step_searchrl_s": 1.0, "step_peer_s": 2.0}
    assert "median 2.00x over 3 interleaved rounds" in describe(summary, "step")


def test_rounds_that_disagree_are_inconclusive():
    result = Comparison((1.0, 1.0, 1.0, 1.0, 1.0), (0.8, 1.2, 1.1, 0.9, 1.3))
    assert result.ratios == pytest.approx([0.8, 1.2, 1.1, 0.9, 1.3])
    summary = result.summary("g")
    assert summary["g_ratio"] == pytest.approx(1.1) and not summary["g_conclusive"]
    assert "inconclusive" in describe(summary, "g")
    assert Comparison((2.0, 2.0), (1.0, 1.5)).conclusive  # slower in every round: conclusive too


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="rounds=0"):
        compare(lambda: None, lambda: None, rounds=0)
