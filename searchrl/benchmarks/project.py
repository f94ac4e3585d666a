"""The projected step time of each paper run (`aot_setups.RUNS`), phase by phase, beside the step time its
peer (the paper's own code) reports on the same hardware.

    python -m searchrl.benchmarks.project [--only SUBSTRING] [--check]

Per run, the cost model (`jaxpr_cost`) counts each program's FLOPs and bytes per device on its traced jaxpr
(nothing is compiled; `aot.learn_inputs` and `aot.rollout_inputs` lay the programs out on the run's devices,
here CPU devices of the same count), and a program takes the slower of its FLOPs at the chip's peak times a
cited model FLOPs utilisation (`MFU`) and its bytes at the chip's HBM bandwidth times a cited decode bandwidth
share (`BANDWIDTH_SHARE`). The workload (`Workload`) is every episode at its config's limits: each turn samples
`rollout.max_turn_tokens`, each search returns `rollout.max_obs_tokens`. The phases of a step:

  prefill      the prompts appended (`extend` chunks, or the one-call `prefill` program);
  decode       the decode steps: the episodes' sampled tokens over the rows decoded at once, each step at the
               mean live length (the paged attention loop counted over that length's pages);
  observations the search results appended;
  retrieval    the searches, at the throughput the retrieval benchmark measured (`RETRIEVAL`);
  scoring      the PPO step's scoring pass (policy, reference and critic forward);
  update       the PPO epochs.

The costs are counted with attention the cost model sees whole: "blockwise" for the PPO step (the block pairs
the Pallas kernels compute) and the paged "reference" loop for the rollout (the pages the kernels read), with
the scoring pass as its own program (`rl.offload_reference`) and unpacked rows as wide as the workload's. The
results file (`RESULTS`) is the source of the generated block of docs/benchmarks.md; --check writes nothing
and fails when the block differs from what the file gives.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import pathlib
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from absl import flags

from searchrl import cli, models, run_config
from searchrl.benchmarks import aot, aot_setups
from searchrl.benchmarks.hardware import GPU_TARGETS, Chip, chip_of
from searchrl.benchmarks.jaxpr_cost import MatmulCost, input_shards, matmul_cost
from searchrl.configlib import sibling
from searchrl.generated import replace_block
from searchrl.run_config import RunConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = pathlib.Path("docs/results/projection.json")
RETRIEVAL = pathlib.Path("docs/results/retrieval_cpu.json")  # `python -m searchrl.benchmarks.retrieval --json`
DOCS = pathlib.Path("docs/benchmarks.md")
BLOCK = "projection"
PHASES = ("prefill", "decode", "observations", "retrieval", "scoring", "update")
PAGED_LOOP = "paged_attention.reference"  # the paged attention loop (`jaxpr_cost.Loop.name`)


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
    "v5p": Cited(0.60, "https://github.com/AI-Hypercomputer/maxtext/blob/main/end_to_end/tpu/gemma/Run_Gemma.md",
                 "MaxText: Gemma-7B bf16 on v5p-128, 60% MFU"),
}


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer's published step time for the runs whose config starts with `run`."""

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
    """What one step of a run does, each episode at its config's limits."""

    episodes: int
    prompt: int  # tokens
    turns: int  # decoded turns an episode
    turn_tokens: int  # sampled tokens a turn
    observations: int  # search results appended an episode
    obs_tokens: int  # tokens a search result
    searches: int  # rounds of one search an episode (the reward's search where the env has no turns)
    length: int  # tokens of a finished episode (at most rollout.max_len)

    def live(self) -> int:
        """The mean live length of a decode step: turn k (from 0) decodes after the prompt and k turns and
        observations, half its own tokens on average."""
        step = self.turn_tokens + self.obs_tokens * (self.observations > 0)
        mean = self.prompt + step * (self.turns - 1) / 2 + self.turn_tokens / 2
        return min(self.length, math.ceil(mean))


def workload(config: RunConfig) -> Workload:
    """The `Workload` of a config: an env with `max_turns` searches that often and then answers; one
    without decodes one turn and searches once, for its reward."""
    rollout, searches = config.rollout, getattr(config.env, "max_turns", None)
    turns, observations = (searches + 1, searches) if searches else (1, 0)
    prompt = min(rollout.max_prompt_tokens, rollout.max_len)
    length = min(rollout.max_len, prompt + turns * rollout.max_turn_tokens
                 + observations * rollout.max_obs_tokens)
    return Workload(aot.batch_rows(config), prompt, turns, rollout.max_turn_tokens, observations,
                    rollout.max_obs_tokens, searches or 1, length)


def costing(config: RunConfig, length: int) -> RunConfig:
    """`config` as the cost model counts it: blockwise attention in the PPO step, the paged reference loop
    in the rollout, the scoring pass a program of its own, unpacked rows `length` tokens wide."""
    mesh = config.mesh
    attention = dataclasses.replace(mesh.attention, impl="blockwise", paged="reference")
    return dataclasses.replace(
        config, mesh=dataclasses.replace(mesh, attention=attention),
        rl=dataclasses.replace(config.rl, offload_reference=True, pack=False),
        rollout=dataclasses.replace(config.rollout, max_len=length))


def paged_trips(config: RunConfig, live: int) -> float:
    """Trips of the paged reference loop at `live` tokens a row: its blocks of whole pages."""
    page = config.rollout.page_size
    per_step = max(1, config.mesh.attention.block_size // page)
    return math.ceil(math.ceil(live / page) / per_step)


def program_costs(config: RunConfig, devices: Sequence[jax.Device], live: int
                  ) -> dict[str, tuple[MatmulCost, tuple]]:
    """Each program's FLOPs and bytes per device (a decode chunk: one decode step) with its arguments, its
    paged attention at `live` tokens a row, traced on a (data, fsdp, tensor) mesh of `devices`."""
    cfg = models.config_from_source(dataclasses.replace(config.model, path=""))
    mesh = models.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices=devices)
    hints = {PAGED_LOOP: paged_trips(config, live)}
    jobs = {**aot.learn_inputs(config, cfg, mesh), **aot.rollout_inputs(config, cfg, mesh)}
    out = {}
    for name, (jitted, args) in jobs.items():
        with jax.set_mesh(mesh):
            jaxpr = jitted.trace(*args).jaxpr
        out[name] = (matmul_cost(jaxpr, trips=hints, devices=mesh.size, in_shards=input_shards(args)), args)
    return out


def seconds(cost: MatmulCost, chip: Chip, mfu: float) -> float:
    """A program's time: the slower of its FLOPs at `mfu` of the chip's peak and its bytes at the cited
    share of its HBM bandwidth."""
    return max(cost.flops / (chip.peak_flops * mfu), cost.bytes / (chip.hbm_bandwidth * BANDWIDTH_SHARE.value))


def phase_calls(work: Workload, costs: Mapping[str, tuple[MatmulCost, tuple]]) -> dict[str, tuple[str, float]]:
    """Each rollout phase's program and how many times a step runs it. An append program's arguments hold
    its chunk (rows, width) after (cfg, params, pool, state, index); a decode chunk's its state's rows."""
    rows, width = costs["extend"][1][5].shape
    groups = math.ceil(work.episodes / rows)
    decode_rows = costs["decode"][1][3].tokens.shape[0]
    prefill = (("prefill", groups) if "prefill" in costs
               else ("extend", groups * math.ceil(work.prompt / width)))
    return {"prefill": prefill,
            "decode": ("decode", math.ceil(work.episodes / decode_rows) * work.turns * work.turn_tokens),
            "observations": ("extend", groups * work.observations * math.ceil(work.obs_tokens / width))}


def project(config: RunConfig, topology: str, devices: Sequence[jax.Device], queries_per_s: float) -> dict:
    """One run's projection: each phase's seconds a step, with what it rests on."""
    work = workload(config)
    chip, mfu = chip_of(topology), MFU[topology.partition(":")[0]].value
    counted = costing(config, work.length)
    costs = program_costs(counted, devices, work.live())
    phases = {name: (program, calls, seconds(costs[program][0], chip, mfu) * calls)
              for name, (program, calls) in phase_calls(work, costs).items()}
    step = {name: costs[name][0] for name in ("score", "learn")}
    decode = costs["decode"][0]
    return {
        "workload": dataclasses.asdict(work) | {"live": work.live()},
        "decode_step": {"tflop": decode.flops / 1e12, "gb": decode.bytes / 1e9,
                        "rows": costs["decode"][1][3].tokens.shape[0]},
        "calls": {name: calls for name, (_, calls, _) in phases.items()},
        "seconds": {**{name: s for name, (_, _, s) in phases.items()},
                    "retrieval": work.episodes * work.searches / queries_per_s,
                    "scoring": seconds(step["score"], chip, mfu), "update": seconds(step["learn"], chip, mfu)},
        "step_tflop": {"scoring": step["score"].flops / 1e12, "update": step["learn"].flops / 1e12},
    }


def peer_of(run: str) -> Peer | None:
    return next((p for p in PEERS if p.run == run), None)


def load_config(run: str) -> RunConfig:
    """The parsed config of a run's "FILE:PRESET,SETUP"."""
    file, _, preset = run.partition(":")
    return run_config.parse(sibling(str(ROOT / "configs" / file), file.removesuffix(".py")).get_config(preset))


def topology_devices(topology: str) -> int:
    """The devices of a topology name: "h100:8" 8, "a100:2x8" 16, "v5p:2x2x2" 8 (one a chip)."""
    return math.prod(int(n) for n in topology.partition(":")[2].split("x"))


def _seconds(s: float) -> str:
    return f"{s:.3g}" if s < 100 else f"{s:.0f}"


def dominant(seconds: Mapping[str, float]) -> str:
    return max(PHASES, key=lambda name: seconds[name])


def render(results: Mapping[str, Any]) -> str:
    """The block: the table, each run's dominant phase and why, and the model's assumptions."""
    lines = [f"Generated by `python -m searchrl.benchmarks.project` on {results['date']} (commit "
             f"{results['commit']}): seconds a step, each phase from the cost model at the cited fractions "
             "of peak (below), every episode at its config's limits.", "",
             "| run | " + " | ".join(PHASES) + " | step | peer's step (s) | peer / projected |",
             "|---|" + "---|" * (len(PHASES) + 3)]
    for run in results["runs"]:
        s = run["projection"]["seconds"]
        total = sum(s[p] for p in PHASES)
        peer = peer_of(run["config"])
        if peer is None:
            quoted, ratio = "no public figure", "-"
        else:
            span = _seconds(peer.low_s) if peer.low_s == peer.high_s else \
                f"{_seconds(peer.low_s)}-{_seconds(peer.high_s)}"
            quoted = f"[{span}]({peer.source})"
            ratio = (f"{peer.low_s / total:.2g}" if peer.low_s == peer.high_s
                     else f"{peer.low_s / total:.2g}-{peer.high_s / total:.2g}")
        lines.append(f"| `{run['config']}` | " + " | ".join(_seconds(s[p]) for p in PHASES)
                     + f" | {_seconds(total)} | {quoted} | {ratio} |")
    lines += ["", *why(results["runs"]), "", *assumptions(results)]
    return "\n".join(lines)


def why(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line a run: the phase that dominates its step and what makes it long."""
    lines = ["Which phase dominates each run, and why:", ""]
    for run in runs:
        p = run["projection"]
        s, work, step = p["seconds"], p["workload"], p["decode_step"]
        top = dominant(s)
        share = s[top] / sum(s[q] for q in PHASES)
        if top == "decode":
            reason = (f"{p['calls']['decode']:,} decode steps ({work['episodes']} episodes x {work['turns']} "
                      f"turns x {work['turn_tokens']} tokens over {step['rows']} rows at once), each reading "
                      f"{step['gb']:.1f} GB a device (the weights and the KV cache at {work['live']:,} live "
                      f"tokens) for one token a row: memory-bound")
        elif top in ("update", "scoring"):
            reason = (f"{p['step_tflop'][top]:,.0f} TFLOP a device over {work['episodes']} rows of "
                      f"{work['length']:,} tokens: compute-bound")
        else:
            reason = f"{p['calls'].get(top, 0):,} calls"
        lines.append(f"- `{run['config']}`: {top}, {share:.0%} of the step: {reason}.")
    return lines


def assumptions(results: Mapping[str, Any]) -> list[str]:
    """The model's assumptions, with the fractions' sources and the peers' settings."""
    retrieval = results["retrieval"]
    mfu = "; ".join(f"{chip}: {c.value:.0%} ([{c.what}]({c.source}))" for chip, c in MFU.items())
    peers = "; ".join(f"`{p.run}`: {p.setting} ({p.source})" for p in PEERS)
    return [
        "The model's assumptions:",
        "",
        "- Every episode runs its config's limits: a search env's `env.max_turns` searches, each returning "
        "`rollout.max_obs_tokens`, then an answer turn, every turn `rollout.max_turn_tokens` sampled tokens, "
        "the prompt `rollout.max_prompt_tokens`; an env without turns decodes once and searches once for its "
        "reward. Episodes that stop early (most do) make every rollout phase shorter: the projection is an "
        "upper bound for the rollout.",
        "- Decoding runs every row to the same number of tokens (rows refilled as episodes end where "
        "`rollout.decode_rows` is set); a decode step attends over the mean live length of its episode.",
        "- Each program takes the slower of its matmul FLOPs (`jaxpr_cost`, a device's share) at a model "
        f"FLOPs utilisation of the chip's peak ({mfu}) and its bytes at {BANDWIDTH_SHARE.value:.1%} of the "
        f"chip's HBM bandwidth ([{BANDWIDTH_SHARE.what}]({BANDWIDTH_SHARE.source}); taken for every chip). "
        "Elementwise work, host time, weight syncs and collectives are not counted.",
        f"- Retrieval: {retrieval['queries_per_s']:,.0f} queries/s, the retrieval benchmark's in-process BM25 "
        f"(`{retrieval['what']}`, `{RETRIEVAL}`), for every run's searches; the papers' own retrievers "
        "(e5 over 21M passages, PubMed's API, SQLite) are not measured here.",
        "- The PPO step is counted on unpacked rows as long as a finished episode, with blockwise attention "
        "(the block pairs the Pallas kernels compute), remat as the run's config sets it.",
        f"- Peers: {peers}. Their runs stop episodes early; the ratio compares their measured step with this "
        "upper bound.",
    ]


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


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
    """The projection of each of `runs` ((config, topology) pairs), on this process's first devices."""
    rate = retrieval_rate(root)["queries_per_s"]
    return [{"config": config, "topology": topology,
             "projection": project(load_config(config), topology, jax.devices()[:topology_devices(topology)],
                                   rate)}
            for config, topology in runs]


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
    check = flags.DEFINE_boolean("check", False, "write nothing; fail if the block is stale", flag_values=values)
    only = flags.DEFINE_string("only", "", "project only the runs whose config contains this (the others "
                               "keep their results)", flag_values=values)
    cli.parse(values, argv, __doc__)
    if check.value:
        if stale(ROOT):
            cli.fail(f"stale projection in {DOCS}: run `python -m searchrl.benchmarks.project`")
        print(f"{DOCS} quotes {RESULTS}")
        return
    runs = [(c, t) for c, t in aot_setups.RUNS if only.value in c]
    jax.config.update("jax_num_cpu_devices", max(topology_devices(t) for _, t in runs))
    path = ROOT / RESULTS
    earlier = json.loads(path.read_text())["runs"] if path.exists() else []
    results = {"date": datetime.date.today().isoformat(), "commit": _commit(),
               "retrieval": retrieval_rate(ROOT), "runs": merged(earlier, run_all(runs, ROOT))}
    path.write_text(json.dumps(results, indent=1) + "\n")
    (ROOT / DOCS).write_text(generated(ROOT))
    print(render(results))


if __name__ == "__main__":
    cli.run(main)
