"""Ahead-of-time compilation for a TPU topology on this CPU-only host (libtpu from `make libtpu`)."""
import importlib.util
import json
import os
import re
import sys

import pytest

from searchrl import models, run_config
from searchrl.benchmarks import aot, aot_setups
from searchrl.benchmarks.hardware import MEGACORE
from searchrl.rollout.engine import RolloutEngine
from searchrl.tasks.autosearch.env import AutoSearchEnv
from searchrl.tasks.search_r1.env import SearchEnv
from searchrl.text.tokenizer import train_bpe_tokenizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "configs"))
import autosearch  # noqa: E402
import search_r1  # noqa: E402

CONFIG = "configs/autosearch.py:tiny"


@pytest.fixture(scope="module")
def devices():
    return aot.topology_devices("v5p:2x2x1", aot.DEFAULT_LIBTPU)


# A topology of each TPU generation libtpu knows, its device kind and its chips' HBM in GiB; compiled for with
# Search-R1's tiny preset, whose PPO step compiles in a third of the CPU time of AutoSearch's.
TPU_CONFIG = "configs/search_r1.py:tiny"
TPU_TOPOLOGIES = [("v4:2x2x1", "TPU v4", 32), ("v5e:2x2", "TPU v5 lite", 16), ("v5p:2x2x1", "TPU v5", 95),
                  ("v6e:2x2", "TPU v6 lite", 32)]


@pytest.mark.parametrize("topology", [t for t, _, _ in TPU_TOPOLOGIES])
def test_a_tpu_topology_has_a_device_per_chip(topology):
    devices = aot.topology_devices(topology, aot.DEFAULT_LIBTPU)
    assert len(devices) == len({tuple(d.coords) for d in devices}) == 4
    # A megacore chip's two TensorCores are one device, as JAX on the pod sees them.
    cores = 2 if topology.partition(":")[0] in MEGACORE else 1
    assert all(d.core_on_chip == 0 and d.num_cores == cores for d in devices)


@pytest.mark.slow
@pytest.mark.parametrize("topology,kind,hbm", TPU_TOPOLOGIES)
def test_the_tiny_preset_compiles_for_each_tpu_generation(topology, kind, hbm, capsys):
    aot.main([f"--config={TPU_CONFIG}", f"--topology={topology}", "--mesh=2,2,1", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["device_kind"] == kind and result["devices"] == 4
    assert result["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
    rows = {r["program"]: r for r in result["programs"]}
    assert list(rows) == ["learn", "prefill", "extend", "decode"]
    for row in rows.values():
        assert row["fits"] and 0 < row["total_gib"] < row["hbm_gib"] == hbm
        assert 0 < row["arguments_gib"] <= row["total_gib"] + row["aliased_gib"]
    # the PPO step holds the optimizer state and its temporaries; a decode chunk the sampling weights and pool
    assert rows["learn"]["total_gib"] > rows["decode"]["arguments_gib"]


def test_a_program_that_does_not_fit_is_reported_not_raised(devices):
    config = autosearch.get_config("tiny")
    # A page pool of 2^24 pages of 16 slots a chip: the tiny model's keys and values there take ~256 GiB.
    config.rollout.pool_pages = 2 ** 24
    row = aot.report(run_config.parse(config), "v5p:2x2x1", devices, (4, 1, 1), ["prefill"])["programs"][0]
    assert not row["fits"] and "RESOURCE_EXHAUSTED" in row["compile_error"] and "total_gib" not in row
    table = aot.format_report({"model": "tiny", "topology": "v5p:2x2x1", "devices": 4, "device_kind": "TPU v5",
                               "mesh": {}, "programs": [row]})
    # what XLA found too big (its message, or what it says the total is required for) against the chip's HBM
    assert re.search(r"\| prefill \| - \| - \| - \| \S.* / 95 \| no \|", table), table


_CUDA_PLUGIN = all(importlib.util.find_spec(name) for name in ("jax_plugins", "jax_plugins.xla_cuda12"))


@pytest.mark.skipif(_CUDA_PLUGIN, reason="JAX's CUDA plugin is installed")
def test_compiling_for_gpus_without_the_cuda_plugin_says_how_to_get_it():
    with pytest.raises(RuntimeError, match=r"CUDA plugin \(no GPU needed\): pip install 'jax\[cuda12\]=="):
        aot.topology_devices("h100:8", aot.DEFAULT_LIBTPU)


@pytest.mark.skipif(not _CUDA_PLUGIN, reason="needs JAX's CUDA plugin: pip install 'jax[cuda12]'")
def test_the_tiny_preset_compiles_for_gpus_without_one(capsys):
    aot.main([f"--config={CONFIG}", "--topology=h100:2x2", "--mesh=2,2,1", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["device_kind"] == "NVIDIA H100 80GB HBM3" and result["devices"] == 4
    for row in result["programs"]:
        assert row["fits"] and 0 < row["total_gib"] < row["hbm_gib"] == 81559 / 1024


def test_a_chunked_prefill_has_no_program_of_its_own():
    config = autosearch.get_config("tiny")
    config.model.path = ""
    run = run_config.parse(config)
    cfg, mesh = models.config_from_source(run.model), models.make_mesh(1, 8, 1)
    assert list(aot.rollout_inputs(run, cfg, mesh)) == ["prefill", "extend", "decode"]
    config.rollout.chunked_prefill = True
    assert list(aot.rollout_inputs(run_config.parse(config), cfg, mesh)) == ["extend", "decode"]


@pytest.mark.parametrize("module,parked", [(autosearch, 0), (autosearch, 3), (search_r1, 0)],
                         ids=["autosearch", "autosearch-parked", "search_r1"])
def test_the_rollout_programs_hold_the_engines_pool_and_rows(module, parked):
    """AOT's page pool and row slots are the trainer's engine's: AutoSearch's with its side branch (the
    intermediate answers: a branch's pages beside each episode's, a wider append for its prompt), Search-R1's
    without one."""
    config = module.get_config("tiny")
    config.model.path, config.rollout.parked_rows = "", parked
    run = run_config.parse(config)
    cfg, mesh = models.config_from_source(run.model), models.make_mesh(1, 8, 1)
    env = (AutoSearchEnv if module is autosearch else SearchEnv)(None, run.env)  # no retriever: not searched
    tokenizer = train_bpe_tokenizer(["search for the answer"] * 20, vocab_size=300)
    engine = RolloutEngine(cfg, tokenizer, env, run.rollout, dtype=run.rl.compute_dtype,
                           placement=models.Placement.of(run.mesh, mesh))
    assert (aot.side_branch(run) is not None) == (env.side_branch is not None) == (module is autosearch)
    inputs = aot.rollout_inputs(run, cfg, mesh)
    _, _, pool, state, *_ = inputs["decode"][1]
    rows = aot.batch_rows(run)
    assert pool.k[0].shape[1] == engine.pool_pages(rows) * engine.shards(rows)
    assert state.tokens.shape == (rows, engine.slots) and state.pages.shape == (rows, engine.table_width)
    assert inputs["extend"][1][5].shape[1] == engine.chunk_widths[-1]  # the widest append


@pytest.mark.parametrize("topology,xla", [("h100:8", "1x1x8"), ("a100:2x8", "1x2x8"), ("h200:1", "1x1x1")])
def test_gpu_topology(topology, xla):
    assert aot.gpu_topology(topology) == xla


def test_bad_input_is_named():
    for topology in ("h100:", "h100:8x", "h100:0", "h100:2x2x2", "h100:eight"):
        with pytest.raises(ValueError, match="expected GEN:GPUS or GEN:HOSTSxGPUS"):
            aot.gpu_topology(topology)
    with pytest.raises(ValueError, match="data,fsdp,tensor"):
        aot.parse_mesh("2x2")
    with pytest.raises(FileNotFoundError, match="make libtpu"):
        aot.topology_devices("v5p:2x2x1", "/nonexistent/libtpu.so")


def _setups_row(program: str, total: float | None) -> dict:
    row = {"program": program, "hbm_gib": 80.0}
    return row if total is None else row | {"total_gib": total}


def test_the_setups_table_marks_what_exceeds_the_budget():
    rollout = {"episodes": 512, "decode_rows": 512, "side_branch": False, "pool_pages": 1024,
               "pool_gib": 2.25}
    report = {"device_kind": "NVIDIA A100-SXM4-80GB", "mesh": {"data": 1, "fsdp": 8, "tensor": 1},
              "rollout": rollout,
              "programs": [_setups_row("learn", 59.5), _setups_row("extend", 61.0), _setups_row("decode", None)]}
    results = {"date": "2026-12-03", "commit": "abc", "jax": "0", "runs": [
        {"config": "x.py:paper,a100x8", "topology": "a100:8", "report": report}]}
    assert aot_setups.budget_gib(report) == 60.0
    assert aot_setups.budget_gib(report | {"memory_fraction": 0.9}) == 72.0
    assert aot_setups.budget_gib(report | {"device_kind": "TPU v5p"}) == 64.0
    row = aot_setups.render(results).splitlines()[-1]
    assert row == ("| `x.py:paper,a100x8` | a100:8 | 1, 8, 1 | 60 | 59.5 | (chunked: extend) | 61.0 (over) "
                   "| does not compile (out of memory) | 512 / 512 | 2.2 | no |")
    # The train state, the PPO step's arguments, stays on the devices while the rollout programs run.
    state = {"program": "learn", "hbm_gib": 80.0, "total_gib": 30.0, "arguments_gib": 20.0}
    report["programs"] = [state, _setups_row("extend", 39.5), _setups_row("decode", 40.5)]
    row = aot_setups.render(results).splitlines()[-1]
    assert row == ("| `x.py:paper,a100x8` | a100:8 | 1, 8, 1 | 60 | 30.0 | (chunked: extend) | 59.5 "
                   "| 60.5 (over) | 512 / 512 | 2.2 | no |")
    # A scoring pass of its own (the reference in host memory) holds its own arguments and is shown beside.
    report["programs"] = [state, _setups_row("score", 61.0) | {"arguments_gib": 24.0},
                          _setups_row("extend", 39.5), _setups_row("decode", 40.0)]
    row = aot_setups.render(results).splitlines()[-1]
    assert row == ("| `x.py:paper,a100x8` | a100:8 | 1, 8, 1 | 60 | 30.0; scoring pass 61.0 (over) "
                   "| (chunked: extend) | 59.5 | 60.0 | 512 / 512 | 2.2 | no |")
    # A run compiling the same programs as another shows that one's figures, and names it.
    results["runs"].append({"config": "x.py:paper_v2,a100x8", "topology": "a100:8",
                            "same_as": "x.py:paper,a100x8"})
    shared = aot_setups.render(results).splitlines()[-1]
    assert shared == row.replace("`x.py:paper,a100x8`",
                                 "`x.py:paper_v2,a100x8` (compiled as `x.py:paper,a100x8`)")


def _expected_paper_presets(file: str) -> list[str]:
    """A config file's paper presets, read off its PRESETS: those named paper*, and DeepRetrieval's family and
    dataset presets."""
    module = aot_setups.config_module(file)
    if file == "deepretrieval.py":
        return [*module.FAMILIES, *module.DATASETS]
    return [name for name in module.PRESETS if name.startswith("paper")]


@pytest.mark.parametrize("file", aot_setups.config_files())
def test_every_paper_preset_of_every_config_file_is_a_run(file):
    module = aot_setups.config_module(file)
    runs = {config for config, _ in aot_setups.RUNS}
    assert _expected_paper_presets(file)
    for name in _expected_paper_presets(file):
        setups = aot_setups.paper_setups(file)[module.get_config(name).model.preset]
        assert {f"{file}:{name},{setup}" for setup in setups} <= runs, name
    assert not {c for c in runs if c.startswith(f"{file}:tiny")}  # CPU-sized presets are no paper runs
    for config, topology in aot_setups.RUNS:
        assert module.hardware.SETUPS[config.rpartition(",")[2]].topology == topology


def _signature(config) -> str:
    return aot.program_signature(run_config.parse(config))


def test_the_program_signature_counts_what_the_programs_read():
    paper = autosearch.get_config("paper,a100x8")
    assert _signature(autosearch.get_config("paper_no_quality,a100x8")) == _signature(paper)  # a reward field
    for group, field, value in [("train", "steps", 7), ("data", "train", "nq"),
                                ("model", "path", "/elsewhere"), ("retrieval", "index_dir", "/elsewhere"),
                                ("env", "topk", 5)]:
        changed = autosearch.get_config("paper,a100x8")
        changed[group].update_from_flattened_dict({field: value})
        assert _signature(changed) == _signature(paper), (group, field)
    for group, field, value in [("rollout", "max_turn_tokens", 400), ("train", "batch_size", 256),
                                ("rl", "micro_batch_size", 32), ("rollout", "pool_pages", 4096),
                                ("env", "intermediate_answers", False),
                                ("env", "intermediate_answer_tokens", 64),
                                ("mesh", "fsdp", 4), ("rl", "actor.lr", 2e-6)]:
        changed = autosearch.get_config("paper,a100x8")
        changed[group].update_from_flattened_dict({field: value})
        assert _signature(changed) != _signature(paper), (group, field)


@pytest.mark.parametrize("file,variant", [("deepretrieval.py", "no_reasoning"), ("rpl.py", "dense"),
                                          ("rpl.py", "dual"), ("rpl.py", "pm"), ("rpl.py", "no_thinking")])
def test_a_presets_variants_compile_its_programs(file, variant):
    """The ",VARIANT" suffixes change prompts, action spaces and program mutation only: a variant compiles
    the programs of its preset, so the table lists the presets alone."""
    module = aot_setups.config_module(file)
    for config in (c for c, _ in aot_setups.RUNS if c.startswith(f"{file}:")):
        preset, _, setup = config.partition(":")[2].rpartition(",")
        variant_config = module.get_config(f"{preset},{variant},{setup}")
        assert _signature(variant_config) == _signature(module.get_config(f"{preset},{setup}")), config


def test_runs_of_the_same_programs_compile_once():
    planned = aot_setups.plan([("search_r1.py:paper,a100x8", "a100:8"),
                               ("search_r1.py:paper_v03,a100x8", "a100:8"),
                               ("search_r1.py:paper,h100x8", "h100:8"),
                               ("search_r1.py:paper_7b,h100x8", "h100:8")])
    assert ["same_as" in run for run in planned] == [False, True, False, False]
    assert planned[1]["same_as"] == "search_r1.py:paper,a100x8"
    assert planned[1]["signature"] == planned[0]["signature"]
    report = {"report": {}}
    compiled = {("search_r1.py:paper,a100x8", "a100:8"): planned[0] | report}
    # a run sharing one's programs is in once that one is, for the same signature
    assert aot_setups.assemble(planned, compiled) == [planned[0] | report, planned[1]]
    compiled[("search_r1.py:paper,a100x8", "a100:8")] = planned[0] | report | {"signature": "older"}
    assert aot_setups.assemble(planned, compiled) == []


def test_the_docs_table_of_the_papers_setups_is_the_results_files():
    """docs/benchmarks.md quotes docs/results/aot_setups.json as `render` makes it, for runs of `RUNS` only."""
    results = json.loads(aot_setups.RESULTS.read_text())
    assert aot_setups.DOCS.read_text() == aot_setups.generated(results)
    assert {(r["config"], r["topology"]) for r in results["runs"]} <= set(aot_setups.RUNS)
