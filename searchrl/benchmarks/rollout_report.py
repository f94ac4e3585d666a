"""The rollout benchmark's published figures, generated from its results files, never typed.

    python -m searchrl.benchmarks.rollout_report [--check]

Each part's results file is the `--json` output of `python -m searchrl.benchmarks.rollout` for that part
(`FILES`: the command that wrote it is in the rendered text); this writes the `rollout` block of
docs/benchmarks.md from them. --check writes nothing and fails when the block differs from what the files
give.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from absl import flags

from searchrl import cli
from searchrl.generated import replace_block

ROOT = Path(__file__).resolve().parents[2]
DOCS = Path("docs/benchmarks.md")
BLOCK = "rollout"
# part -> its results file, beside the command line that wrote it
FILES = {"s": Path("docs/results/rollout_decode_scaling_cpu.json"),
         "d": Path("docs/results/rollout_long_tail_cpu.json"),
         "i": Path("docs/results/rollout_answers_cpu.json")}
COMMANDS = {"s": "--parts s --rounds 9", "d": "--parts d --preset tiny",
            "i": "--parts i --preset tiny"}


def _ratio(r: Mapping[str, Any], prefix: str) -> str:
    return (f"{r[f'{prefix}_ratio']:.2f}x (range {r[f'{prefix}_ratio_min']:.2f}-{r[f'{prefix}_ratio_max']:.2f} "
            f"over {r[f'{prefix}_rounds']} interleaved rounds)")


def decode_scaling(r: Mapping[str, Any]) -> str:
    few, many = r["decode_scaling_slots"]
    fast, slow = r["decode_scaling_ms_per_step"]
    low, high = r["decode_scaling_cost_ratio_range"]
    return (f"- **(s) decode cost against reserved slots**: a decode step ({r['decode_scaling_preset']} preset) "
            f"of {r['decode_scaling_rows']} rows holding {r['decode_scaling_live']} live tokens each costs {fast:.2f} ms with {few} slots a row "
            f"and {slow:.2f} ms with {many}: {r['decode_scaling_cost_ratio']:.2f}x (range {low:.2f}-{high:.2f}).")


def long_tail(r: Mapping[str, Any]) -> str:
    mix = "/".join(f"{m:.0%}" for m in r["long_tail_calls_mix"])
    rates = {name: (r[f"long_tail_{name}_episodes_per_s"], r[f"long_tail_{name}_utilisation"],
                    r[f"long_tail_{name}_idle_share"]) for name in ("continuous", "lockstep")}
    return (f"- **(d) long tail** (episodes of 1-4 tool calls, measured mix {mix}): continuous batching "
            f"{rates['continuous'][0]:.2f} episodes/s at {rates['continuous'][1]:.1%} decode slot "
            f"utilisation (device idle waiting for the host at most {rates['continuous'][2]:.1%}), lock step "
            f"{rates['lockstep'][0]:.2f} at {rates['lockstep'][1]:.1%} (idle {rates['lockstep'][2]:.1%}); "
            f"continuous over lock step {_ratio(r, 'long_tail')}, {r['long_tail_compiles_after_warmup']} "
            f"compiles after warm-up.")


def intermediate_answers(r: Mapping[str, Any]) -> str:
    rates = {name: (r[f"answers_{name}_episodes_per_s"], r[f"answers_{name}_utilisation"])
             for name in ("answers", "plain")}
    return (f"- **(i) intermediate answers** ({r['answers_tokens']} tokens after each search, "
            f"{r['answers_per_rollout']} a rollout, forked rows decoding beside the episodes): "
            f"{rates['answers'][0]:.2f} episodes/s at {rates['answers'][1]:.1%} utilisation, against "
            f"{rates['plain'][0]:.2f} at {rates['plain'][1]:.1%} without them: {_ratio(r, 'answers')}"
            + ("." if "answers_yields_per_rollout" not in r else
               f"; a rollout, {r['answers_yields_per_rollout']:.0f} branches late for a row took their episode's "
               f"(the episode parked) and {r['answers_asides_per_rollout']:.0f} ran aside, the other rows waiting."))


PARTS = {"s": decode_scaling, "d": long_tail, "i": intermediate_answers}


def render(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The block's Markdown: one line a part, with the machine and the command behind it."""
    lines = []
    for part, line in PARTS.items():
        r = results[part]
        lines.append(line(r))
        lines.append(f"  ({r['device']}, {r['dtype']}; `python -m searchrl.benchmarks.rollout "
                     f"{COMMANDS[part]} --json > {FILES[part]}`)")
    return "\n".join(lines)


def load(root: Path) -> dict[str, dict]:
    return {part: json.loads((root / path).read_text()) for part, path in FILES.items()}


def generated(root: Path) -> str:
    """docs/benchmarks.md with its rollout block as the results files give it."""
    return replace_block((root / DOCS).read_text(), BLOCK, render(load(root)), DOCS)


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    check = flags.DEFINE_boolean("check", False, "write nothing; fail if the block is stale", flag_values=values)
    cli.parse(values, argv, __doc__)
    text = generated(ROOT)
    if check.value:
        if text != (ROOT / DOCS).read_text():
            cli.fail(f"stale rollout figures in {DOCS}: run `python -m searchrl.benchmarks.rollout_report`")
        print(f"{DOCS} quotes {', '.join(map(str, FILES.values()))}")
        return
    (ROOT / DOCS).write_text(text)
    print(f"wrote {DOCS}")


if __name__ == "__main__":
    cli.run(main)
