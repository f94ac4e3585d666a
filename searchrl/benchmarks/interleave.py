"""Timing searchrl against a peer on a shared, noisy machine: the two run in turns (A B A B ...), each round
gives one speed ratio, and the result is the median ratio with its range over the rounds.

A load spike then slows one round of both sides instead of all of one side. The comparison is conclusive
when every round agrees on which side is faster; otherwise the machine was too noisy to tell.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Seconds per call of each side, one entry per round."""

    ours_s: tuple[float, ...]
    peer_s: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        """Per round: how many times faster searchrl was (peer seconds / our seconds)."""
        return [peer / ours for ours, peer in zip(self.ours_s, self.peer_s, strict=True)]

    @property
    def conclusive(self) -> bool:
        return min(self.ratios) > 1.0 or max(self.ratios) < 1.0

    def summary(self, prefix: str) -> dict[str, float | bool | int]:
        """The median ratio, its range, whether it is conclusive, and each side's median seconds per call."""
        return {f"{prefix}_ratio": statistics.median(self.ratios), f"{prefix}_ratio_min": min(self.ratios),
                f"{prefix}_ratio_max": max(self.ratios), f"{prefix}_conclusive": self.conclusive,
                f"{prefix}_rounds": len(self.ratios), f"{prefix}_searchrl_s": statistics.median(self.ours_s),
                f"{prefix}_peer_s": statistics.median(self.peer_s)}


def compare(ours: Callable[[], object], peer: Callable[[], object], rounds: int = 5, calls: int = 1,
            warmup: int = 1, clock: Callable[[], float] = time.perf_counter) -> Comparison:
    """Times `calls` calls of each side per round, for `rounds` rounds in turns, after `warmup` calls of
    each (compilation). Each callable must block until its work is done."""
    if rounds < 1 or calls < 1:
        raise ValueError(f"rounds={rounds} and calls={calls} must be at least 1")
    for _ in range(warmup):
        ours(), peer()
    times: dict[str, list[float]] = {"ours": [], "peer": []}
    for _ in range(rounds):
        for side, fn in (("ours", ours), ("peer", peer)):
            start = clock()
            for _ in range(calls):
                fn()
            times[side].append((clock() - start) / calls)
    return Comparison(tuple(times["ours"]), tuple(times["peer"]))


def describe(summary: dict, prefix: str) -> str:
    """One line: the median ratio, its range and the verdict."""
    verdict = ("conclusive" if summary[f"{prefix}_conclusive"]
               else "inconclusive: the rounds disagree on which is faster")
    return (f"ratio searchrl / peer speed: median {summary[f'{prefix}_ratio']:.2f}x over "
            f"{summary[f'{prefix}_rounds']} interleaved rounds (range {summary[f'{prefix}_ratio_min']:.2f}x"
            f" to {summary[f'{prefix}_ratio_max']:.2f}x), {verdict}")
