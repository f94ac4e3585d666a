"""A multi-seed miniature's seeds, run one after another or side by side, and what it writes: each figure per
seed and over the seeds (mean and a 95% interval), results.md and results.json under its workdir."""
from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import os
from typing import Any, Callable, Mapping, Sequence, TypeVar

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


def excludes_zero(summary: Mapping[str, Any]) -> bool:
    """Whether an `interval` lies wholly above or below 0 (False without one)."""
    return summary["low"] is not None and (summary["low"] > 0 or summary["high"] < 0)


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


def claim(paper: str, name: str, statement: str, measured: Any, threshold: str, holds: bool
          ) -> dict[str, Any]:
    """One claim of a paper checked on a miniature's results, as claims.json lists it."""
    return {"paper": paper, "claim": name, "statement": statement, "measured": measured,
            "threshold": threshold, "holds": bool(holds)}


def per_seed_interval(values: Mapping[str, float]) -> dict[str, Any]:
    """Per-seed values and their `interval` over the seeds (a claim's `measured`)."""
    return {"per_seed": dict(values), **interval(list(values.values()))}


def paired(per_seed: Mapping[str, Mapping[str, Mapping[str, float]]], better: str, base: str, metric: str
           ) -> dict[str, Any]:
    """`better` - `base` on `metric`, per seed and as an `interval` over the seeds (a paired comparison: each
    seed's two policies share its world and cold start)."""
    return per_seed_interval({seed: r[better][metric] - r[base][metric] for seed, r in per_seed.items()})
