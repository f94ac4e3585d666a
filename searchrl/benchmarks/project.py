"""The projected step time of each paper run (`aot_setups.RUNS`), phase by phase, beside the step time its
peer (the paper's own code) reports on the same hardware.

    python -m searchrl.benchmarks.project [--only SUBSTRING] [--docs_only] [--check]

Per run, the cost model (`jaxpr_cost`) counts each program's FLOPs and bytes per device on its traced jaxpr
(nothing is compiled; `aot.learn_inputs` and `aot.rollout_inputs` lay the programs out on the run's devices,
here CPU devices of the same count), and a program takes the slower of its FLOPs at the chip's peak times a
cited model FLOPs utilisation (`MFU`) and its bytes at the chip's HBM bandwidth times a cited decode bandwidth
share (`BANDWIDTH_SHARE`). Two workloads (`Workload`): the Search-R1-like mix of lengths the AOT table lays
out (`mix`, for envs that search) and every episode at its config's limits (`limits`). The phases of a step:

  prefill      the prompts appended (`extend` chunks, or the one-call `prefill` program);
  decode       the decode steps: the episodes' sampled tokens over the rows decoded at once, each step at the
               mean live length (the paged attention loop counted over that length's pages);
  observations the search results appended;
  retrieval    the searches, at the throughput the retrieval benchmark measured (`RETRIEVAL`);
  scoring      the PPO step's scoring pass (policy, reference and critic forward);
  update       the PPO epochs.

Attention is counted as the cost model sees it whole (`costing`): "blockwise" in the PPO step (the block
pairs the Pallas kernels compute) and the paged "reference" loop in the rollout (the pages the kernels read),
with the scoring pass a program of its own (`rl.offload_reference`). The results file (`RESULTS`) is the
source of the generated block of docs/benchmarks.md; --check writes nothing and fails when the block differs
from what the file gives.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from absl import flags

from searchrl import cli, models, run_config
from searchrl.benchmarks import aot, aot_setups
from searchrl.benchmarks.gpu_check import paged_trips
from searchrl.benchmarks.hardware import GPU_TARGETS, Chip, chip_of
from searchrl.benchmarks.jaxpr_cost import MatmulCost, input_shards, matmul_cost
from searchrl.benchmarks.lengths import search_r1_episodes
from searchrl.configlib import sibling
from searchrl.generated import checkout_commit, replace_block
from searchrl.run_config import RunConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = pathlib.Path("docs/results/projection.json")
# `python -m searchrl.benchmarks.retrieval --json`
RETRIEVAL = pathlib.Path("docs/results/retrieval_cpu.json")
DOCS = pathlib.Path("docs/benchmarks.md")
BLOCK = "projection"
PHASES = ("prefill", "decode", "observations", "retrieval", "scoring", "update")


@dataclasses.dataclass(frozen=True)
class Cited:
    """A figure from outside, with where it comes from."""

    value: float
    source: str  # a link
    what: str  # the setting it was measured in


# gpt-fast's Llama-2-7B bf16 decode (batch 1) on one A100-80GB: 1,397.31 GB/s of the A100's 2,039.
BANDWIDTH_SHARE = Cited(1397.31e9 / GPU_TARGETS["a100"].chip.hbm_bandwidth,
                        "https://github.com/pytorch-labs/gpt-fast#benchmarks",
                        "gpt-fast's Llama-2-7B bf16 decode on one A100-80GB: 1,397 GB/s (batch 1)")
# Model FLOPs utilisation by chip generation (the topology's prefix).
MFU = {
    "a100": Cited(0.52, "https://arxiv.org/abs/2104.04473",
                  "Megatron-LM: 52% of peak per A100 (a 1T-parameter GPT on 3,072 A100s)"),
    "h100": Cited(0.38, "https://arxiv.org/abs/2407.21783",
                  "Llama 3 405B: 38-43% BF16 MFU on 8,192-16,384 H100s (the lower end)"),
    "v5p": Cited(0.60,
                 "https://github.com/AI-Hypercomputer/maxtext/blob/main/end_to_end/tpu/gemma/Run_Gemma.md",
                 "MaxText: Gemma-7B bf16 on v5p-128, 60% MFU"),
}


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer's published step time (a range where the report gives one) for one run of `RUNS`."""

    run: str  # "FILE:PRESET,SETUP"
    low_s: float
    high_s: float
    source: str
    setting: str


PEERS = (
    Peer("search_r1.py:paper,h100x8", 2 * 3600 / 200, 3 * 3600 / 200,
         "https://github.com/PeterGriffinJin/Search-R1/issues/1",
         "Search-R1's author: 200 steps of the 3B PPO run on 8 H100s took about 2 to 3 hours"),
    Peer("deepretrieval.py:literature,a100x2", 40 * 3600 / 1250, 40 * 3600 / 1250,
         "https://github.com/pat-jj/DeepRetrieval/issues/2",
         "DeepRetrieval's author: PubMed search, step 1,250 after about 40 hours on 2 A100-80GB PCIe"),
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one step of a run does: its episodes' mean parts, and the rows of its PPO step."""

    name: str  # "limits" or "mix"
    episodes: int
    prompt: float  # tokens
    turns: float  # decoded turns an episode
    turn_tokens: float  # sampled tokens a turn
    observations: float  # search results appended an episode
    obs_tokens: float  # tokens a search result
    searches: float  # searches an episode (the reward's search where the env has no turns)
    longest: int  # sampled tokens of the longest episode
    max_len: int  # rollout.max_len
    length: int  # the PPO step's unpacked rows' tokens; 0: packed, as the trainer packs the mix (`lengths`)

    def live(self) -> int:
        """The mean live length of a decode step: turn k (from 0) decodes after the prompt and k turns and
        observations, half its own tokens on average."""
        step = self.turn_tokens + self.obs_tokens * (self.observations > 0)
        return min(self.max_len, math.ceil(self.prompt + step * (self.turns - 1) / 2 + self.turn_tokens / 2))

    def decode_steps(self, rows: int) -> int:
        """Decode steps on `rows` rows at once: the episodes' sampled tokens over the rows (refilled as
        episodes end), and at least the longest episode's."""
        return max(math.ceil(self.episodes * self.turns * self.turn_tokens / rows), self.longest)


def limits(config: RunConfig) -> Workload:
    """Every episode at its config's limits: an env with `max_turns` searches that often, each result
    `rollout.max_obs_tokens`, then answers, each turn `rollout.max_turn_tokens`; one without decodes one turn
    and searches once, for its reward. The PPO step's rows are a finished episode long."""
    rollout, searches = config.rollout, getattr(config.env, "max_turns", None)
    turns, observations = (searches + 1, searches) if searches else (1, 0)
    prompt = min(rollout.max_prompt_tokens, rollout.max_len)
    length = min(rollout.max_len, prompt + turns * rollout.max_turn_tokens
                 + observations * rollout.max_obs_tokens)
    return Workload("limits", aot.batch_rows(config), prompt, turns, rollout.max_turn_tokens, observations,
                    rollout.max_obs_tokens, searches or 1, turns * rollout.max_turn_tokens, rollout.max_len,
                    length)


def mix(config: RunConfig) -> Workload | None:
    """The Search-R1-like mix of `lengths.search_r1_episodes` (the AOT's and the padding benchmark's) for an
    env that searches (`max_turns`), its PPO step packed as the trainer packs it; None for one that does
    not."""
    if not getattr(config.env, "max_turns", None):
        return None
    rows = aot.batch_rows(config)
    episodes = search_r1_episodes(rows, config.rollout)
    searches = float(episodes.searches.mean())
    turns = searches + 1
    return Workload("mix", rows, float(episodes.prompt.mean()), turns,
                    float(episodes.sampled.mean()) / turns, searches,
                    float(episodes.observed.mean()) / searches, searches, int(episodes.sampled.max()),
                    config.rollout.max_len, 0)


def costing(config: RunConfig, work: Workload) -> RunConfig:
    """`config` as the cost model counts it: blockwise attention in the PPO step, the paged reference loop
    in the rollout, the scoring pass a program of its own, the PPO step's rows unpacked and a finished
    episode long where `work` says so."""
    rl, rollout = config.rl, config.rollout
    if work.length:
        rl, rollout = dataclasses.replace(rl, pack=False), dataclasses.replace(rollout, max_len=work.length)
    return dataclasses.replace(config, mesh=config.mesh.with_attention(impl="blockwise", paged="reference"),
                               rl=dataclasses.replace(rl, offload_reference=True), rollout=rollout)


def program_costs(config: RunConfig, devices: Sequence[jax.Device], live: int,
                  traced: dict[tuple, MatmulCost] | None = None) -> dict[str, tuple[MatmulCost, tuple]]:
    """Each program's FLOPs and bytes per device (a decode chunk: one decode step) with its arguments, its
    paged attention at `live` tokens a row, traced on a (data, fsdp, tensor) mesh of `devices`. A program
    whose arguments (arrays' shapes, dtypes and shardings, static settings) are in `traced` is not traced
    again: it is the same program."""
    traced = {} if traced is None else traced
    cfg = models.config_from_source(dataclasses.replace(config.model, path=""))
    mesh = models.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices=devices)
    hints = paged_trips(config, live)
    jobs = {**aot.learn_inputs(config, cfg, mesh), **aot.rollout_inputs(config, cfg, mesh)}
    out = {}
    for name, (jitted, args) in jobs.items():
        key = (name, repr(args), tuple(hints.items()))
        if key not in traced:
            with jax.set_mesh(mesh):
                jaxpr = jitted.trace(*args).jaxpr
            traced[key] = matmul_cost(jaxpr, trips=hints, devices=mesh.size, in_shards=input_shards(args))
        out[name] = (traced[key], args)
    return out


def seconds(cost: MatmulCost, chip: Chip, mfu: float) -> float:
    """A program's time: the slower of its FLOPs at `mfu` of the chip's peak and its bytes at the cited
    share of its HBM bandwidth."""
    return max(cost.flops / (chip.peak_flops * mfu),
               cost.bytes / (chip.hbm_bandwidth * BANDWIDTH_SHARE.value))


def phase_calls(work: Workload, costs: Mapping[str, tuple[MatmulCost, tuple]]) -> dict[str, tuple[str, int]]:
    """Each rollout phase's program and how many times a step runs it. An append program's arguments hold
    its chunk (rows, width) after (cfg, params, pool, state, index); a decode chunk's its state's rows."""
    rows, width = costs["extend"][1][5].shape
    decode_rows = costs["decode"][1][3].tokens.shape[0]
    prefill = (("prefill", math.ceil(work.episodes / rows)) if "prefill" in costs
               else ("extend", math.ceil(work.episodes / rows) * math.ceil(work.prompt / width)))
    appends = math.ceil(work.episodes * work.observations / rows) * math.ceil(work.obs_tokens / width)
    return {"prefill": prefill, "decode": ("decode", work.decode_steps(decode_rows)),
            "observations": ("extend", appends)}


def costs_of(config: RunConfig, work: Workload, devices: Sequence[jax.Device],
             traced: dict[tuple, MatmulCost] | None = None) -> dict[str, tuple[MatmulCost, tuple]]:
    """`program_costs` of `config` as the cost model counts it for `work` (`costing`), at its mean live
    length."""
    return program_costs(costing(config, work), devices, work.live(), traced)


def project(work: Workload, topology: str, costs: Mapping[str, tuple[MatmulCost, tuple]],
            queries_per_s: float) -> dict:
    """A run's projection for `work` from its programs' costs (`costs_of`): each phase's seconds a step,
    with what it rests on."""
    chip, mfu = chip_of(topology), MFU[topology.partition(":")[0]].value
    calls = phase_calls(work, costs)
    # without a reference there is no scoring program of its own: the scoring pass is in "learn"
    step = {name: costs[name][0] if name in costs else MatmulCost() for name in ("score", "learn")}
    decode = costs["decode"][0]
    return {
        "workload": dataclasses.asdict(work) | {"live": work.live()},
        "decode_step": {"tflop": decode.flops / 1e12, "gb": decode.bytes / 1e9,
                        "rows": costs["decode"][1][3].tokens.shape[0]},
        "calls": {name: n for name, (_, n) in calls.items()},
        "seconds": {**{name: seconds(costs[program][0], chip, mfu) * n
                       for name, (program, n) in calls.items()},
                    "retrieval": work.episodes * work.searches / queries_per_s,
                    "scoring": seconds(step["score"], chip, mfu),
                    "update": seconds(step["learn"], chip, mfu)},
        "step_tflop": {"scoring": step["score"].flops / 1e12, "update": step["learn"].flops / 1e12},
    }


def peer_of(run: str) -> Peer | None:
    return next((p for p in PEERS if p.run == run), None)


def load_config(run: str) -> RunConfig:
    """The parsed config of a run's "FILE:PRESET,SETUP"."""
    file, _, preset = run.partition(":")
    module = sibling(str(ROOT / "configs" / file), file.removesuffix(".py"))
    return run_config.parse(module.get_config(preset))


def topology_devices(topology: str) -> int:
    """The devices of a topology name: "h100:8" 8, "a100:2x8" 16, "v5p:2x2x2" 8 (one a chip)."""
    return math.prod(int(n) for n in topology.partition(":")[2].split("x"))


def _seconds(s: float) -> str:
    return f"{s:.3g}" if s < 100 else f"{s:.0f}"


def dominant(seconds: Mapping[str, float]) -> str:
    return max(PHASES, key=lambda name: seconds[name])


def total(projection: Mapping[str, Any]) -> float:
    return sum(projection["seconds"][p] for p in PHASES)


def shown(run: Mapping[str, Any]) -> dict[str, Any]:
    """The projection a run's row shows: at the mix where its env searches, else at its limits."""
    return run["mix"] or run["limits"]


def _peer(config: str, step: float) -> tuple[str, str]:
    """A row's peer cells: its step time, linked, and its ratio to `step`."""
    peer = peer_of(config)
    if peer is None:
        return "no public figure", "-"
    one = peer.low_s == peer.high_s
    span = _seconds(peer.low_s) if one else f"{_seconds(peer.low_s)}-{_seconds(peer.high_s)}"
    ratio = f"{peer.low_s / step:.2g}" if one else f"{peer.low_s / step:.2g}-{peer.high_s / step:.2g}"
    return f"[{span}]({peer.source})", ratio


def render(results: Mapping[str, Any]) -> str:
    """The block: the table, each run's dominant phase and why, and the model's assumptions."""
    lines = [f"Generated by `python -m searchrl.benchmarks.project` on {results['date']} (commit "
             f"{results['commit']}): seconds a step, each phase from the cost model at the cited fractions "
             "of peak (assumptions below); the phases at the Search-R1-like mix of lengths (`mix`) where the "
             "env searches, else at the config's limits (`limits`), and the step with every episode at its "
             "limits beside them.", "",
             "| run | workload | " + " | ".join(PHASES) + " | step | step at the limits | peer's step (s) "
             "| peer / step |", "|---|---|" + "---|" * (len(PHASES) + 4)]
    for run in results["runs"]:
        row = shown(run)
        quoted, ratio = _peer(run["config"], total(row))
        lines.append(f"| `{run['config']}` | {row['workload']['name']} | "
                     + " | ".join(_seconds(row["seconds"][p]) for p in PHASES)
                     + f" | {_seconds(total(row))} | {_seconds(total(run['limits']))} | {quoted} | {ratio} |")
    lines += ["", *why(results["runs"]), "", *assumptions(results)]
    return "\n".join(lines)


def why(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """How many runs each phase dominates, then one line a run: its dominant phase and what makes it long."""
    tops = [dominant(shown(run)["seconds"]) for run in runs]
    counts = ", ".join(f"{phase} in {tops.count(phase)}" for phase in PHASES if phase in tops)
    lines = [f"Which phase dominates each run, and why ({counts} of the {len(runs)} runs):", ""]
    for run, top in zip(runs, tops):
        p = shown(run)
        s, work, step = p["seconds"], p["workload"], p["decode_step"]
        share = s[top] / total(p)
        if top == "decode":
            reason = (f"{p['calls']['decode']:,} decode steps ({work['episodes']} episodes of "
                      f"{work['turns'] * work['turn_tokens']:,.0f} sampled tokens on average over "
                      f"{step['rows']} rows at once), each reading {step['gb']:.1f} GB a device (the weights "
                      f"and the KV cache at {work['live']:,} live tokens) for one token a row: memory-bound")
        elif top in ("update", "scoring"):
            what = ("the PPO epochs' forward, backward and recomputed forward of every trained model"
                    if top == "update" else "a forward pass of each model that scores")
            rows = (f"{work['episodes']} rows of {work['length']:,} tokens" if work["length"]
                    else f"the mix's {work['episodes']} episodes packed into rows")
            reason = f"{p['step_tflop'][top]:,.0f} TFLOP a device, {what}, over {rows}: compute-bound"
        elif top == "retrieval":
            reason = f"{work['episodes'] * work['searches']:,.0f} searches at the measured BM25 throughput"
        else:
            reason = f"{p['calls'][top]:,} append calls, each reading the weights"
        second = max((q for q in PHASES if q != top), key=lambda q: s[q])
        lines.append(f"- `{run['config']}` ({work['name']}): {top}, {share:.0%} of the step: {reason}; "
                     f"then {second}, {s[second] / total(p):.0%}.")
    return lines


def assumptions(results: Mapping[str, Any]) -> list[str]:
    """The model's assumptions, with the fractions' sources and the peers' settings."""
    retrieval = results["retrieval"]
    mfu = "; ".join(f"{chip}: {c.value:.0%} ([{c.what}]({c.source}))" for chip, c in MFU.items())
    peers = "; ".join(f"`{p.run}`: {p.setting} ({p.source})" for p in PEERS)
    return [
        "The model's assumptions:",
        "",
        "- `mix`: the episodes of `lengths.search_r1_episodes` (prompts of 150-400 tokens, 1-4 searches of "
        "50-300 sampled tokens and a 300-500-token result each, an answer of 20-100 tokens, each part cut at "
        "the config's limits), the PPO step on them packed as the trainer packs them (`rl.pack`); the AOT "
        "table and the padding benchmark lay out the same mix. It is Search-R1's shape, taken for every env "
        "that searches.",
        "- `limits`: every episode at its config's limits: `env.max_turns` searches, each returning "
        "`rollout.max_obs_tokens`, then an answer turn, every turn `rollout.max_turn_tokens` sampled tokens, "
        "the prompt `rollout.max_prompt_tokens`; an env without turns decodes once and searches once, for "
        "its reward. The PPO step on unpacked rows a finished episode long. An upper bound.",
        "- Decode rows are refilled as episodes end where `rollout.decode_rows` is set, so a rollout takes "
        "its episodes' sampled tokens over the rows in decode steps, and at least its longest episode's; "
        "every decode step and every append (`rollout.extend_rows` rows a call: prompt chunks and search "
        "results) attends over the episodes' mean live length. Every episode prefills its own prompt (a GRPO "
        "group's responses that start together share one prefill in the engine: an overcount there).",
        "- Each program takes the slower of its matmul FLOPs (`jaxpr_cost`, a device's share) at a model "
        f"FLOPs utilisation of the chip's peak ({mfu}) and its bytes at {BANDWIDTH_SHARE.value:.1%} of the "
        f"chip's HBM bandwidth ([{BANDWIDTH_SHARE.what}]({BANDWIDTH_SHARE.source}); taken for every chip). "
        "Elementwise work, host time, weight syncs and collectives are not counted.",
        "- Attention is counted as the cost model sees it whole: blockwise in the PPO step (the block pairs "
        "the Pallas kernels compute) and the paged reference loop in the rollout (the live pages the kernels "
        "read). The scoring pass (policy, reference and critic forward) is a program of its own; a run "
        "without a reference scores within its update (scoring 0).",
        f"- Retrieval: {retrieval['queries_per_s']:,.0f} queries/s, the retrieval benchmark's in-process "
        "BM25 "
        f"({retrieval['what']}; `{RETRIEVAL}`), for every run's searches; the papers' own retrievers "
        "(e5 over 21M passages, PubMed's API, SQLite) are not measured here.",
        f"- Peers: {peers}. Their steps ran their own episodes' lengths, which neither workload reproduces.",
    ]


def retrieval_rate(root: pathlib.Path) -> dict[str, Any]:
    """The retrieval benchmark's in-process BM25 throughput and the corpus it was measured on."""
    r = json.loads((root / RETRIEVAL).read_text())
    return {"queries_per_s": r["bm25_wrapper_qps"],
            "what": f"bm25s, {r['passages']:,} synthetic passages, {r['queries']:,} queries, k={r['k']}, "
                    f"{r['cpus']} CPUs"}


def generated(root: pathlib.Path) -> str:
    """docs/benchmarks.md with its projection block as the results file gives it."""
    results = json.loads((root / RESULTS).read_text())
    return replace_block((root / DOCS).read_text(), BLOCK, render(results), DOCS)


def run_all(runs: Sequence[tuple[str, str]], root: pathlib.Path) -> list[dict[str, Any]]:
    """The projections of each of `runs` ((config, topology) pairs) at its limits and its mix, on this
    process's first devices; a program that runs share (the same arguments) is traced once."""
    rate = retrieval_rate(root)["queries_per_s"]
    traced: dict[tuple, MatmulCost] = {}
    out = []
    for config, topology in runs:
        parsed, devices = load_config(config), jax.devices()[:topology_devices(topology)]
        workloads = {"limits": limits(parsed), "mix": mix(parsed)}
        out.append({"config": config, "topology": topology} | {
            name: None if work is None
            else project(work, topology, costs_of(parsed, work, devices, traced), rate)
            for name, work in workloads.items()})
    return out


def merged(earlier: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`earlier` runs with `new` ones in their place, in `aot_setups.RUNS`' order; runs no longer in RUNS
    are dropped."""
    by_run = {(r["config"], r["topology"]): r for r in [*earlier, *new]}
    return [dict(by_run[run]) for run in aot_setups.RUNS if run in by_run]


def stale(root: pathlib.Path) -> bool:
    """Whether the block in docs/benchmarks.md differs from what the results file gives."""
    return generated(root) != (root / DOCS).read_text()


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    check = flags.DEFINE_boolean("check", False, "write nothing; fail if the block is stale",
                                 flag_values=values)
    only = flags.DEFINE_string("only", "", "project only the runs whose config contains this (the others "
                               "keep their results)", flag_values=values)
    docs_only = flags.DEFINE_boolean("docs_only", False,
                                     "rewrite the block from the results file, projecting nothing",
                                     flag_values=values)
    cli.parse(values, argv, __doc__)
    if docs_only.value:
        (ROOT / DOCS).write_text(generated(ROOT))
        print(f"wrote {DOCS}")
        return
    if check.value:
        if stale(ROOT):
            cli.fail(f"stale projection in {DOCS}: run `python -m searchrl.benchmarks.project`")
        print(f"{DOCS} quotes {RESULTS}")
        return
    runs = [(c, t) for c, t in aot_setups.RUNS if only.value in c]
    jax.config.update("jax_num_cpu_devices", max(topology_devices(t) for _, t in runs))
    path = ROOT / RESULTS
    earlier = json.loads(path.read_text())["runs"] if path.exists() else []
    results = {"date": datetime.date.today().isoformat(), "commit": checkout_commit(ROOT),
               "retrieval": retrieval_rate(ROOT), "runs": merged(earlier, run_all(runs, ROOT))}
    path.write_text(json.dumps(results, indent=1) + "\n")
    (ROOT / DOCS).write_text(generated(ROOT))
    print(render(results))


if __name__ == "__main__":
    cli.run(main)
