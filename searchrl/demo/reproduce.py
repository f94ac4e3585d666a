"""`make reproduce`: the CPU miniatures over seeds, and each paper's claims checked on them.

    python -m searchrl.demo.reproduce [--seeds 0,1,2,3,4] [--papers autosearch,deepretrieval,rpl]
        [--out runs/reproduce]

--papers: tasks with a miniature (`searchrl.task.Demo`), by default all of them. Runs each one's miniature
(`python -m searchrl.demo` with its reproduction preset, `Demo.reproduce`) for every seed,
each seed re-drawing its world, cold start and RL, under OUT/<paper>; then writes OUT/claims.json: every
claim of every paper run (its statement, measured value with the per-seed values and a 95% Student-t interval
over the seeds, threshold, and whether it holds) and per paper its seeds, wall time, date, commit and
machine. A paper run again replaces its own entry; the others' are kept. A claim that fails is reported as
failing. `python -m searchrl.demo.publish` turns claims.json and the results into the README's table and
docs/results.md.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import time
from typing import Any, Sequence

from absl import flags

from searchrl import cli, run_config, task
from searchrl.demo import config as demo_config, miniature

CLAIMS_FILE = "claims.json"


def miniature_config(paper: str, seeds: Sequence[int], out: str) -> run_config.RunConfig:
    """The paper's reproduction preset (`Demo.reproduce`: every arm its claims compare), over `seeds`,
    writing under out/<paper>."""
    config = demo_config.preset(task.get(paper).demo.reproduce)
    config.workdir = os.path.join(out, paper)
    config.demo.seeds = tuple(seeds)
    return run_config.parse(config)


def provenance() -> dict[str, Any]:
    """When, from which commit and on what machine the claims were measured."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    return {"date": datetime.date.today().isoformat(), "commit": git("rev-parse", "HEAD") or None,
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}, "
                       f"Python {platform.python_version()}"}


def reproduce(papers: Sequence[str], seeds: Sequence[int], out: str) -> dict[str, Any]:
    """Runs each paper's miniature over `seeds`; writes and returns claims.json's contents. A paper's entry
    (its run's provenance) and claims replace those of an earlier run in `out`; other papers' are kept."""
    report = read(out)
    for paper in papers:
        config = miniature_config(paper, seeds, out)
        began, source = time.perf_counter(), provenance()  # the code as the run starts
        results = miniature.run(config)
        report["papers"][paper] = {"preset": task.get(paper).demo.reproduce, "seeds": list(seeds),
                                   "workdir": config.workdir,
                                   "results": os.path.join(config.workdir, "results.json"),
                                   "wall_s": round(time.perf_counter() - began, 1), **source}
        report["claims"] = [c for c in report["claims"] if c["paper"] != paper] + results["claims"]
        report["all_hold"] = all(c["holds"] for c in report["claims"])
        write(report, out)  # what is measured so far survives a later miniature's failure
    return report


def read(out: str) -> dict[str, Any]:
    """out/claims.json, or an empty report."""
    path = os.path.join(out, CLAIMS_FILE)
    if not os.path.exists(path):
        return {"papers": {}, "claims": [], "all_hold": True}
    with open(path) as f:
        return json.load(f)


def write(report: dict[str, Any], out: str) -> None:
    """out/claims.json, replaced whole (written aside, then renamed)."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, CLAIMS_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(path + ".tmp", path)


def claims_table(claims: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per claim, its measured mean (and interval), threshold and verdict."""
    lines = ["| paper | claim | measured | threshold | holds |", "|---|---|---|---|---|"]
    for c in claims:
        verdict = c["verdict"] if c["verdict"] == "yes" else f"**{c['verdict']}**"
        lines.append(f"| {c['paper']} | {c['statement']} | {measured_text(c['measured'])} | "
                     f"{c['threshold']} | {verdict} |")
    return "\n".join(lines)


def verdict_counts(claims: Sequence[dict[str, Any]]) -> str:
    """How many claims are shown, not shown and failing, in words."""
    verdicts = [c["verdict"] for c in claims]
    return (f"{verdicts.count('yes')} of {len(verdicts)} claims shown, {verdicts.count('not shown')} not "
            f"shown (the mean alone), {verdicts.count('no')} failing")


def measured_text(measured: Any) -> str:
    """A claim's measured value in words: mean [low, high] over n seeds, its per-seed verdicts, or each of
    several named measurements."""
    if isinstance(measured, dict) and "mean" in measured:
        if measured["low"] is None:
            return f"{measured['mean']:.3f} (1 seed)"
        low, high = measured["low"], measured["high"]
        return f"{measured['mean']:.3f} [{low:.3f}, {high:.3f}], {measured['n']} seeds"
    if isinstance(measured, dict) and "per_seed" in measured:
        held = measured["per_seed"]
        return f"{sum(map(bool, held.values()))} of {len(held)} seeds"
    if isinstance(measured, dict):  # several named measurements
        return "; ".join(f"{name} {measured_text(value)}" for name, value in measured.items())
    return f"{measured:.3f}" if isinstance(measured, float) else str(measured)


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    seeds = flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "seeds of every miniature",
                              flag_values=values)
    papers = flags.DEFINE_list("papers", [], "miniatures to run (default: every task's)", flag_values=values)
    out = flags.DEFINE_string("out", "runs/reproduce", "where the runs and claims.json go",
                              flag_values=values)
    cli.parse(values, argv, __doc__)
    known = task.with_demo()
    unknown = sorted(set(papers.value) - set(known))
    if unknown:
        cli.fail(f"--papers: unknown {unknown}; expected some of {known}")
    report = reproduce(papers.value or known, cli.non_negative_ints(seeds.value, "seeds"), out.value)
    print(claims_table(report["claims"]))
    print(f"{verdict_counts(report['claims'])}; {out.value}/{CLAIMS_FILE}")


if __name__ == "__main__":
    cli.run(main)
