"""A multi-seed miniature's seeds, run one after another or side by side, and what it writes: each figure per
seed and over the seeds (mean and a 95% interval), results.md and results.json under its workdir; and the rule
a claim is judged by (`above`, `on_every_seed`): an interval that clears the claim's margin, never a mean."""
from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import os
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
Job, Result = TypeVar("Job"), TypeVar("Result")


def run_seeds(run: Callable[[Job], Result], jobs: Sequence[Job], processes: int) -> list[Result]:
    """`run(job)` for each seed's job, in order; with `processes` > 1, that many seeds at a time, each in a
    fresh process (`run` a module-level function, jobs and results picklable). A tiny model's step keeps few
    cores busy, so seeds side by side finish sooner; each seed computes what it would alone."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if processes == 1 or len(jobs) < 2:
        return [run(job) for job in jobs]
    with concurrent.futures.ProcessPoolExecutor(min(processes, len(jobs)),
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run, jobs))


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The mean of `values` (one per seed) and the two-sided Student-t `confidence` interval of that mean
    (n - 1 degrees of freedom, the sample standard deviation): {"mean", "low", "high", "n"}. With one value
    there is no interval (low and high are None)."""
    x = np.asarray(values, np.float64)
    if x.ndim != 1 or not len(x):
        raise ValueError(f"interval needs one value per seed, got {values!r}")
    mean = float(x.mean())
    if len(x) == 1:
        return {"mean": mean, "low": None, "high": None, "n": 1}
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(x)}


VERDICTS = ("yes", "not shown", "no")  # a claim shown, its mean on the claimed side only, or not even that


def above(summary: Mapping[str, Any], margin: float = 0.0) -> str:
    """The verdict on "the mean over the seeds lies above `margin`" (an `interval`): "yes" only when the 95%
    interval's lower end is above it, "not shown" when the mean alone is (or one seed gives no interval), "no"
    when the mean is not. A comparison is a paired difference above 0; a "kept" (non-inferiority) claim a
    difference above a negative margin. A mean never shows a claim by itself."""
    if summary["mean"] <= margin:
        return "no"
    return "yes" if summary["low"] is not None and summary["low"] > margin else "not shown"


def on_every_seed(held: Iterable[bool]) -> str:
    """The verdict on a claim checked seed by seed: "yes" when it held on every one."""
    return "yes" if all(held) else "no"


def weakest(*verdicts: str) -> str:
    """The verdict on several conditions that must all hold: the weakest of theirs."""
    return max(verdicts, key=VERDICTS.index)


def seed_intervals(per_seed: Mapping[str, Mapping[str, Mapping[str, float]]], policies: Sequence[str],
                   metrics: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """policy -> metric -> its `interval` over the seeds' results."""
    return {policy: {m: interval([r[policy][m] for r in per_seed.values()]) for m in metrics}
            for policy in policies}


def write_results(workdir: str, table: str, results: Mapping[str, Any]) -> None:
    """Prints the Markdown `table`; writes it to workdir/results.md and `results` to workdir/results.json."""
    print(table)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


def claim(paper: str, name: str, statement: str, measured: Any, threshold: str, verdict: str
          ) -> dict[str, Any]:
    """One claim of a paper checked on a miniature's results, as claims.json lists it: its `verdict` (one of
    `VERDICTS`) and whether it holds (shown: "yes")."""
    if verdict not in VERDICTS:
        raise ValueError(f"claim {paper}/{name}: verdict {verdict!r} is not one of {VERDICTS}")
    return {"paper": paper, "claim": name, "statement": statement, "measured": measured,
            "threshold": threshold, "verdict": verdict, "holds": verdict == "yes"}


def per_seed_interval(values: Mapping[str, float]) -> dict[str, Any]:
    """Per-seed values and their `interval` over the seeds (a claim's `measured`)."""
    return {"per_seed": dict(values), **interval(list(values.values()))}


def paired(per_seed: Mapping[str, Mapping[str, Mapping[str, float]]], better: str, base: str, metric: str
           ) -> dict[str, Any]:
    """`better` - `base` on `metric`, per seed and as an `interval` over the seeds (a paired comparison: each
    seed's two policies share its world and cold start)."""
    return per_seed_interval({seed: r[better][metric] - r[base][metric] for seed, r in per_seed.items()})
