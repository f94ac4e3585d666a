"""The papers' runs on the papers' machines, compiled ahead of time on this host: does every program of each
fit its devices at the paper's own batch, micro-batch and lengths?

    python -m searchrl.benchmarks.aot_setups [--only SUBSTRING] [--force] [--results PATH]

Each run of `RUNS` is a config with its hardware setup (configs/hardware.py) and the topology it compiles for
(`searchrl.benchmarks.aot`, one process per run: a compile of a 7B PPO step takes GiBs of host memory). RUNS
is every paper preset of every config file on the setups the docs recommend for it (`paper_runs`: the
file's `PAPER_SETUPS`, by the preset's model); runs whose
programs are the same (`aot.program_signature`) compile once, the first of them, and the others show its
figures. A run already in the results file for its current signature is kept unless `--force` (a matrix
takes hours on 2 cores; an interrupted one resumes). The results file (JSON: the reports, with the date,
commit and JAX version) is the source of the table in docs/benchmarks.md, which this command rewrites in its
generated block (`render`), and of docs/running.md's "which preset for which hardware" table (`hardware_table`).
GPU topologies need JAX's CUDA plugin (`make aot-gpu`, then run with .venv-gpu/bin/python), TPU ones libtpu
(`make libtpu`).
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence
from types import ModuleType

import jax
from absl import flags

from searchrl import cli, run_config
from searchrl.benchmarks import aot
from searchrl.configlib import sibling
from searchrl.generated import checkout_commit, replace_block
from searchrl.run_config import RunConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "aot_setups.json"
DOCS = ROOT / "docs" / "benchmarks.md"
BLOCK = "aot_setups"  # the docs block the table is generated into
HARDWARE_DOCS, HARDWARE_BLOCK = ROOT / "docs" / "running.md", "hardware"  # "which preset for which hardware"
CPU_SIZED = ("tiny", "smoke")  # the presets' name prefixes that run on a CPU
# The budget a program must fit: on GPUs what JAX preallocates (`distributed.memory_fraction` of the memory,
# by default 0.75); on TPUs 80% of HBM.
JAX_GPU_FRACTION, TPU_SHARE = 0.75, 0.8
CONFIGS = ROOT / "configs"
TPU_SETUPS = ("v5p8",)  # their runs compile last (the matrix goes config file by config file)


def config_module(file: str) -> ModuleType:
    """The config file `file` of configs/, loaded from its path."""
    return sibling(str(CONFIGS / file), file.removesuffix(".py"))


def paper_presets(file: str) -> list[str]:
    """The paper presets of a config file: every entry of its PRESETS but the CPU-sized ones (`CPU_SIZED`)."""
    return [name for name in config_module(file).PRESETS if not name.startswith(CPU_SIZED)]


def config_files() -> list[str]:
    """The config files of configs/ with presets, by name."""
    return sorted(p.name for p in CONFIGS.glob("*.py") if hasattr(config_module(p.name), "PRESETS"))


def paper_setups(file: str) -> dict[str, tuple[str, ...]]:
    """The setups the docs recommend for a config file's paper presets, by the preset's model: the file's own
    `PAPER_SETUPS` (none for a file without paper presets)."""
    return getattr(config_module(file), "PAPER_SETUPS", {})


def paper_runs() -> tuple[tuple[str, str], ...]:
    """(config "FILE:PRESET,SETUP", topology) of every paper preset on each setup the docs recommend for
    it (`paper_setups`), file by file, TPU runs last."""
    runs = []
    for file in config_files():
        module, setups = config_module(file), paper_setups(file)
        for name in paper_presets(file):
            for setup in setups[module.get_config(name).model.preset]:
                runs.append((setup in TPU_SETUPS, f"{file}:{name},{setup}",
                             module.hardware.SETUPS[setup].topology))
    return tuple((config, topology) for _, config, topology in sorted(runs, key=lambda r: r[0]))


RUNS = paper_runs()


def load(config: str) -> RunConfig:
    """The parsed config of a run's "FILE:PRESET,SETUP"."""
    file, _, preset = config.partition(":")
    return run_config.parse(config_module(file).get_config(preset))


def plan(runs: Sequence[tuple[str, str]]) -> list[dict]:
    """Each run with its programs' signature (`aot.program_signature`) and, where an earlier run compiles the
    same programs for the same topology, that run's config (`same_as`): it is compiled once."""
    first: dict[tuple[str, str], str] = {}
    planned = []
    for config, topology in runs:
        signature = aot.program_signature(load(config))
        shared = first.setdefault((signature, topology), config)
        planned.append({"config": config, "topology": topology, "signature": signature}
                       | ({} if shared == config else {"same_as": shared}))
    return planned


def budget_gib(report: dict) -> float:
    """The memory a run's programs must fit per device (see JAX_GPU_FRACTION, TPU_SHARE)."""
    hbm = report["programs"][0]["hbm_gib"]
    if report["device_kind"].startswith("TPU"):
        return TPU_SHARE * hbm
    return (report.get("memory_fraction") or JAX_GPU_FRACTION) * hbm


def compile_run(config: str, topology: str) -> dict:
    """`searchrl.benchmarks.aot --json` of one run, in its own process."""
    command = [sys.executable, "-m", "searchrl.benchmarks.aot", f"--config=configs/{config}",
               f"--topology={topology}", "--json"]
    env = os.environ | {"JAX_PLATFORMS": "cpu"}  # compiling only: the CUDA plugin then checks no driver
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{config} on {topology} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


STEP_PROGRAMS = ("score", "learn")  # the PPO step's programs (`ppo.learn_programs`)


def on_device_gib(rows: dict[str, dict]) -> dict[str, float | None]:
    """Each program's GiB per device while it runs (None: it did not compile). The PPO step's programs' own
    figures hold the train state (their arguments); a rollout program's adds the train state, which stays
    on the devices between steps: the arguments of the step's "learn" program (its batch is a few MiB of
    them; a reference in host memory is not among them where the scoring pass is a program of its own)."""
    state = rows["learn"].get("arguments_gib", 0.0) if "learn" in rows else 0.0
    return {name: None if "total_gib" not in row else row["total_gib"] + (0.0 if name in STEP_PROGRAMS
                                                                          else state)
            for name, row in rows.items()}


def _memory(gib: float | None, budget: float) -> str:
    if gib is None:
        return "does not compile (out of memory)"
    return f"{gib:.1f}" + ("" if gib <= budget else " (over)")


def render(results: dict) -> str:
    """The Markdown table of a results file: per run, each program's GiB per device (`on_device_gib`)
    against its budget, the rows it decodes at once against its episodes and its KV page pool; a run that
    shares another's programs (`same_as`) shows that run's figures."""
    programs = ("learn", "prefill", "extend", "decode")
    reports = {(r["config"], r["topology"]): r["report"] for r in results["runs"] if "report" in r}
    lines = [f"Generated by `python -m searchrl.benchmarks.aot_setups` on {results['date']} (commit "
             f"{results['commit']}, JAX {results['jax']}); GiB per device, XLA's memory analysis, the "
             "rollout programs' with the train state beside them. A run compiled as another compiles the "
             "same programs (`aot.program_signature`) and shows its figures.", "",
             "| run | topology | mesh (data, fsdp, tensor) | budget GiB | PPO step | prefill | extend "
             "| decode chunk | decode rows / episodes | KV pool GiB | fits |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        report = reports[run.get("same_as", run["config"]), run["topology"]]
        budget = budget_gib(report)
        gib = on_device_gib({row["program"]: row for row in report["programs"]})
        cells = [_memory(gib[p], budget) if p in gib else "(chunked: extend)" for p in programs]
        if "score" in gib:  # the step's scoring pass is a program of its own
            cells[0] += f"; scoring pass {_memory(gib['score'], budget)}"
        rollout = report["rollout"]
        cells += [f"{rollout['decode_rows']} / {rollout['episodes']}", f"{rollout['pool_gib']:.1f}"]
        fits = all(g is not None and g <= budget for g in gib.values())
        mesh = ", ".join(str(n) for n in report["mesh"].values())
        name = f"`{run['config']}`" + (f" (compiled as `{run['same_as']}`)" if "same_as" in run else "")
        lines.append(f"| {name} | {run['topology']} | {mesh} | {budget:.0f} | "
                     + " | ".join(cells) + f" | {'yes' if fits else 'no'} |")
    return "\n".join(lines)


def _by_file(configs: Sequence[str]) -> str:
    """"FILE:PRESET[,SETUP]" configs as "`FILE`: PRESET, PRESET; ..." (setups dropped), in order."""
    presets: dict[str, list[str]] = {}
    for config in configs:
        file, _, preset = config.partition(":")
        name = preset.rsplit(",", 1)[0] if "," in preset else preset
        presets.setdefault(file, [])
        if name not in presets[file]:
            presets[file].append(name)
    return "; ".join(f"`{file}`: {', '.join(names)}" for file, names in presets.items())


def hardware_table(results: dict) -> str:
    """Which preset runs on which hardware: the CPU-sized presets of every config file on a laptop or Colab
    CPU, and per hardware setup (configs/hardware.py) the paper runs of the results file, with their meshes,
    their largest program's GiB per device against the budget, and whether every one fits."""
    cpu = [f"{f}:{name}" for f in config_files() for name in config_module(f).PRESETS
           if name.startswith(CPU_SIZED)]
    cpu_meshes = "; ".join(sorted({", ".join("all" if n == -1 else str(n) for n in (m.data, m.fsdp, m.tensor))
                                   for m in (load(config).mesh for config in cpu)}))
    setups = config_module("hardware.py").SETUPS
    reports = {(r["config"], r["topology"]): r["report"] for r in results["runs"] if "report" in r}
    rows: dict[str, list[tuple[str, dict]]] = {}
    for run in results["runs"]:
        rows.setdefault(run["config"].rsplit(",", 1)[1], []).append(
            (run["config"], reports[run.get("same_as", run["config"]), run["topology"]]))
    gpus = min(setups[s].devices for s in rows if not setups[s].topology.startswith("v"))
    lines = ["| hardware | setup | mesh (data, fsdp, tensor) | runs | largest program / budget, GiB per device "
             "| all fit |", "|---|---|---|---|---|---|",
             f"| laptop or Colab CPU | (none) | {cpu_meshes} | {_by_file(cpu)} | - | - |",
             f"| one GPU (or Colab's) | (none) | {cpu_meshes} | the CPU presets above; no paper preset (the smallest "
             f"paper setup takes {gpus} GPUs) | - | - |"]
    for setup, runs in sorted(rows.items(), key=lambda item: (setups[item[0]].topology.startswith("v"),
                                                              setups[item[0]].devices, item[0])):
        kind = runs[0][1]["device_kind"]
        meshes = sorted({", ".join(str(n) for n in report["mesh"].values()) for _, report in runs})
        fits = all(g is not None and g <= budget_gib(report) for _, report in runs
                   for g in on_device_gib({row["program"]: row for row in report["programs"]}).values())
        lines.append(f"| {setups[setup].devices} x {kind} | `{setup}` ({setups[setup].topology}) | "
                     f"{'; '.join(meshes)} | {_by_file([c for c, _ in runs])} | "
                     f"{_worst(runs)} | {'yes' if fits else 'no'} |")
    return "\n".join(lines)


def _worst(runs: Sequence[tuple[str, dict]]) -> str:
    """The largest share of its budget any program of `runs` takes, as "GiB / budget"."""
    shares = []
    for _, report in runs:
        budget = budget_gib(report)
        shares += [(g / budget, g, budget) for g in on_device_gib({row["program"]: row
                                                                    for row in report["programs"]}).values()
                   if g is not None]
    _, gib, budget = max(shares)
    return f"{gib:.1f} / {budget:.0f}"


def generated(results: dict, docs: pathlib.Path = DOCS) -> str:
    """`docs` with its generated `BLOCK` as `render(results)` gives it (`searchrl.generated`)."""
    return replace_block(docs.read_text(), BLOCK, render(results), docs)


def write_docs(results: dict, docs: pathlib.Path = DOCS) -> None:
    docs.write_text(generated(results, docs))
    text = HARDWARE_DOCS.read_text()
    HARDWARE_DOCS.write_text(replace_block(text, HARDWARE_BLOCK, hardware_table(results), HARDWARE_DOCS))


def _save(results: dict, path: pathlib.Path) -> None:
    """Writes `results` atomically: an interrupted write never truncates earlier runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(path)


def assemble(planned: Sequence[dict], compiled: dict[tuple[str, str], dict]) -> list[dict]:
    """The results' runs in `planned`'s order: each compiled run with its report, each run that shares one's
    programs once that one is in (`compiled`: config and topology -> its entry, for the current signature)."""
    def current(config: str, topology: str, signature: str) -> bool:
        entry = compiled.get((config, topology))
        return entry is not None and entry["signature"] == signature

    return [compiled[run["config"], run["topology"]] if "same_as" not in run else run for run in planned
            if current(run.get("same_as", run["config"]), run["topology"], run["signature"])]


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    only = flags.DEFINE_string("only", "", "compile only the runs whose config contains this", flag_values=values)
    force = flags.DEFINE_boolean("force", False, "recompile runs already in the results", flag_values=values)
    path = flags.DEFINE_string("results", str(RESULTS), "the results file", flag_values=values)
    cli.parse(values, argv, __doc__)
    results_path = pathlib.Path(path.value)
    results = json.loads(results_path.read_text()) if results_path.exists() else {"runs": []}
    compiled = {(r["config"], r["topology"]): r for r in results["runs"]
                if "report" in r and "signature" in r}  # a run of an older results file is compiled again
    planned = plan(RUNS)
    for run in planned:
        key = run["config"], run["topology"]
        if "same_as" in run or only.value not in run["config"] or (
                not force.value and key in compiled and compiled[key]["signature"] == run["signature"]):
            continue
        print(f"compiling {run['config']} for {run['topology']}", flush=True)
        compiled[key] = run | {"report": compile_run(*key)}
        results |= {"runs": assemble(planned, compiled), "date": datetime.date.today().isoformat(),
                    "commit": checkout_commit(ROOT), "jax": jax.__version__}
        _save(results, results_path)
        write_docs(results)  # the docs quote the results file, however far the matrix got
    results["runs"] = assemble(planned, compiled)
    write_docs(results)
    print(render(results))


if __name__ == "__main__":
    cli.run(main)
