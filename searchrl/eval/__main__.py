"""Greedy evaluation of a checkpoint: the papers' tables and AutoSearch's search-depth analysis; AutoSearch's
pilot study at forced search depth; the prompting baselines.

    python -m searchrl.eval --config configs/FILE.py:PRESET --checkpoint CKPT [--datasets nq,hotpotqa]
        [--split test] [--out DIR] [--limit N] [--budgets 0,1,2,3,4] [--step N] [--batch_size B]
        [--noside_branch] [--config.x.y=value ...]
    python -m searchrl.eval --pilot --config ... --checkpoints CKPT1,CKPT2 [--depths 0,1,2,3,4] [...]
    python -m searchrl.eval --baselines direct,cot,rag,ircot,search_o1 --config ... --checkpoint CKPT [--chat]

CKPT: a trainer checkpoint dir (`<workdir>/checkpoints`, or the workdir itself; --step picks a step, default
the latest) or a Hugging Face model dir; without it, the config's own policy (config.model.path) is evaluated.
Writes results.md / .csv / .json, predictions.jsonl and depth_analysis.png to --out (default:
<CKPT>/eval[/step_N], or <config.workdir>/eval) and prints the results table. --pilot (`searchrl.eval.pilot`)
writes pilot.md / .json, pilot_accuracy.png, pilot_depth.png and predictions.jsonl (default --out:
<config.workdir>/pilot); --baselines (`searchrl.eval.baselines`) writes baselines.md / .json and a report per
method (default --out: the evaluation's, plus /baselines).
"""
from __future__ import annotations

from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from searchrl.eval import baselines, harness, pilot, report

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config: configs/FILE.py:PRESET.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Trainer checkpoint dir, run workdir or Hugging Face "
                                  "model dir (default: the config's policy).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_DATASETS = flags.DEFINE_string("datasets", "", "Comma-separated dataset names (default: config.data.eval).")
_SPLIT = flags.DEFINE_string("split", "", "Split to evaluate (default: config.data.eval_split).")
_OUT = flags.DEFINE_string("out", "", "Output directory (default: <checkpoint>/eval or <workdir>/eval).")
_LIMIT = flags.DEFINE_integer("limit", None, "First N questions per dataset (default: "
                              "config.data.eval_limit; 0: all).")
_BUDGETS = flags.DEFINE_list("budgets", [], "Search budgets for the accuracy-vs-budget curve, e.g. 0,1,2,3,4 "
                             "(default: none).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "Rollout rows per batch (default: "
                                   "config.train.batch_size).")
_SIDE_BRANCH = flags.DEFINE_bool("side_branch", True, "Run the env's side branch (for search QA with "
                                 "config.env.intermediate_answers: the depth analysis).")
_PILOT = flags.DEFINE_bool("pilot", False, "Run AutoSearch's pilot study: accuracy at forced search depth "
                           "and the minimal sufficient depth, for each of --checkpoints.")
_CHECKPOINTS = flags.DEFINE_list("checkpoints", [], "--pilot: the checkpoints (e.g. HF model dirs of several "
                                 "sizes; default: --checkpoint).")
_DEPTHS = flags.DEFINE_list("depths", [], "--pilot: forced search depths (default: 0 .. "
                            "config.env.max_turns).")
_BASELINES = flags.DEFINE_list("baselines", [], f"Prompting baselines to run, of {list(baselines.METHODS)}.")
_CHAT = flags.DEFINE_bool("chat", False, "--baselines: prompt through the tokenizer's chat template "
                          "(instruct models).")


def parse_budgets(values: list[str], flag: str = "budgets") -> list[int]:
    """Integers >= 0 from a list flag; anything else is a usage error naming the value."""
    budgets = []
    for value in values:
        if not value.strip().isdigit():
            raise app.UsageError(f"--{flag}: {value!r} is not a non-negative integer.")
        budgets.append(int(value))
    return budgets


def run_pilot() -> None:
    checkpoints = _CHECKPOINTS.value or [_CHECKPOINT.value]
    results = pilot.run_pilot(_CONFIG.value, checkpoints, parse_budgets(_DEPTHS.value, "depths"),
                              datasets=_DATASETS.value, split=_SPLIT.value, limit=_LIMIT.value,
                              batch_size=_BATCH_SIZE.value)
    out = _OUT.value or Path(_CONFIG.value.workdir) / "pilot"
    paths = pilot.write_pilot(results, out)
    print(pilot.pilot_markdown(results))
    print(f"wrote {', '.join(sorted(paths))} to {out}")


def run_baselines() -> None:
    results, info = baselines.evaluate_baselines_checkpoint(
        _CONFIG.value, _CHECKPOINT.value, step=_STEP.value, methods=_BASELINES.value,
        datasets=_DATASETS.value, split=_SPLIT.value, limit=_LIMIT.value, batch_size=_BATCH_SIZE.value,
        use_chat=_CHAT.value)
    out = _OUT.value or harness.default_out_dir(_CONFIG.value, info) / "baselines"
    paths = baselines.write_baselines(results, out)
    print(baselines.baselines_markdown(results))
    print(f"wrote {', '.join(sorted(paths))} to {out}")


def run_eval() -> None:
    results, info = harness.evaluate_checkpoint(
        _CONFIG.value, _CHECKPOINT.value, step=_STEP.value, datasets=_DATASETS.value, split=_SPLIT.value,
        limit=_LIMIT.value, budgets=parse_budgets(_BUDGETS.value), batch_size=_BATCH_SIZE.value,
        side_branch=_SIDE_BRANCH.value)
    out = _OUT.value or harness.default_out_dir(_CONFIG.value, info)
    paths = report.write_report(results, out)
    print(report.main_markdown(results))
    print(f"wrote {', '.join(sorted(paths))} to {out}")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/search_r1.py:tiny")
    if _PILOT.value and _BASELINES.value:
        raise app.UsageError("--pilot and --baselines are separate runs: give one of them.")
    if _PILOT.value:
        run_pilot()
    elif _BASELINES.value:
        run_baselines()
    else:
        run_eval()


if __name__ == "__main__":
    app.run(main)
