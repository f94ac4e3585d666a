"""The projected step time: the decode step of a tiny config against a hand count, the table of every paper
run, and --check on a stale block."""
import dataclasses
import json
import math
import shutil

import jax
import pytest

from searchrl import models
from searchrl.benchmarks import aot_setups, project
from searchrl.benchmarks.gpu_check import paged_trips
from searchrl.benchmarks.hardware import GPU_TARGETS
from searchrl.benchmarks.jaxpr_cost import MatmulCost
from searchrl.benchmarks.lengths import search_r1_episodes, search_r1_lengths


@pytest.fixture(scope="module")
def tiny():
    """Search-R1's tiny preset on one device, as the cost model counts it, with its programs' costs at a live
    length of 300 tokens."""
    config = project.load_config("search_r1.py:tiny")
    work = project.limits(config)
    counted = project.costing(config, work)
    return counted, work, project.program_costs(counted, jax.devices()[:1], live=300)


def test_the_limits_of_a_search_preset():
    config = project.load_config("search_r1.py:paper")
    work = project.limits(config)
    assert (work.episodes, work.prompt, work.turns, work.turn_tokens) == (512, 2048, 5, 500)
    assert work.observations == work.searches == 4
    assert work.length == 6144  # 2,048 + 5 x 500 + 4 x 500 tokens, cut at rollout.max_len
    assert work.live() == 2048 + 1000 * 2 + 250  # the mean of turns 0..4: two turns and observations before
    assert work.decode_steps(512) == 2500 and work.decode_steps(256) == 5000


def test_the_mix_is_the_aot_tables_and_only_for_envs_that_search():
    config = project.load_config("search_r1.py:paper")
    work = project.mix(config)
    episodes = search_r1_episodes(512, config.rollout)
    assert work.turns * work.turn_tokens == pytest.approx(episodes.sampled.mean())
    assert work.observations * work.obs_tokens == pytest.approx(episodes.observed.mean())
    assert work.decode_steps(512) == episodes.sampled.max()  # all rows at once: the longest episode
    assert (search_r1_lengths(512, config.rollout)
            == episodes.prompt + episodes.sampled + episodes.observed).all()  # none past max_len here
    assert project.mix(project.load_config("deepretrieval.py:literature")) is None


def test_decode_step_against_a_hand_count(tiny):
    counted, _, costs = tiny
    cfg = models.config_from_source(dataclasses.replace(counted.model, path=""))
    cost, args = costs["decode"]
    rows = args[3].tokens.shape[0]
    item = 4  # float32 compute in the tiny preset
    layer = cfg.hidden_size * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim \
        + 3 * cfg.hidden_size * cfg.intermediate_size
    weights = (cfg.num_layers * layer + cfg.vocab_size * cfg.hidden_size) * item
    # the reference loop reads whole blocks of `block_size` slots: 300 live tokens are one block of 512
    slots = paged_trips(counted, 300)["paged_attention.reference"] * counted.mesh.attention.block_size
    cache = rows * slots * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * item
    # a layer's float32 scores, written by q.k and read by p.v
    scores = cfg.num_layers * 2 * rows * cfg.num_heads * slots * 4
    assert cost.bytes == pytest.approx(weights + cache + scores, rel=0.1)
    flops = 2 * rows * (cfg.num_layers * layer + cfg.vocab_size * cfg.hidden_size)
    assert cost.flops >= flops


def test_decode_phase_is_its_steps_bytes_at_the_cited_bandwidth_share(tiny):
    _, work, costs = tiny
    calls = project.phase_calls(work, costs)
    rows = costs["decode"][1][3].tokens.shape[0]
    assert calls["decode"] == ("decode", math.ceil(work.episodes / rows) * work.turns * work.turn_tokens)
    chip = GPU_TARGETS["a100"].chip
    cost = costs["decode"][0]
    assert cost.flops / cost.bytes < chip.peak_flops / chip.hbm_bandwidth  # memory-bound
    expected = cost.bytes / (chip.hbm_bandwidth * project.BANDWIDTH_SHARE.value)
    assert project.seconds(cost, chip, project.MFU["a100"].value) == pytest.approx(expected)


def test_a_compute_bound_program_takes_its_flops_at_the_mfu():
    chip = GPU_TARGETS["h100"].chip
    assert project.seconds(MatmulCost(2e15, 1e9), chip, 0.5) == pytest.approx(2e15 / (chip.peak_flops * 0.5))


def _results() -> dict:
    """A results file with made-up seconds for every paper run (rendering only)."""
    seconds = dict(zip(project.PHASES, (1.0, 30.0, 2.0, 0.5, 10.0, 20.0)))
    projection = {"seconds": seconds, "calls": {"prefill": 4, "decode": 2500, "observations": 8},
                  "workload": {"name": "limits", "episodes": 512, "turns": 5, "turn_tokens": 500,
                               "searches": 4, "live": 4298, "length": 6144},
                  "decode_step": {"tflop": 0.4, "gb": 18.6, "rows": 512},
                  "step_tflop": {"scoring": 9000.0, "update": 23000.0}}
    return {"date": "2026-12-07", "commit": "abc1234",
            "retrieval": {"queries_per_s": 1000.0, "what": "bm25s"},
            "runs": [{"config": c, "topology": t, "limits": projection, "mix": None}
                     for c, t in aot_setups.RUNS]}


def test_the_table_has_every_paper_run_and_the_peers_links():
    text = project.render(_results())
    for config, _ in aot_setups.RUNS:
        assert f"| `{config}` |" in text
        assert f"- `{config}` (limits): decode, 47% of the step" in text  # 30 of 63.5 s
        assert "; then update, 31%." in text
    for peer in project.PEERS:
        assert f"]({peer.source})" in text
    assert text.count("no public figure") == len(aot_setups.RUNS) - len(project.PEERS)
    for cited in (project.BANDWIDTH_SHARE, *project.MFU.values()):
        assert cited.source in text


def test_check_fails_on_a_stale_block(tmp_path, monkeypatch):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    shutil.copy(project.ROOT / project.DOCS, tmp_path / project.DOCS)
    results = _results()
    (tmp_path / project.RESULTS).write_text(json.dumps(results))
    (tmp_path / project.DOCS).write_text(project.generated(tmp_path))
    monkeypatch.setattr(project, "ROOT", tmp_path)
    project.main(["--check"])
    results["runs"][0]["limits"]["seconds"]["decode"] = 31.0
    (tmp_path / project.RESULTS).write_text(json.dumps(results))
    with pytest.raises(SystemExit):
        project.main(["--check"])


def test_a_partial_run_keeps_the_other_runs_in_runs_order():
    (first, _), (second, _), *_ = aot_setups.RUNS
    runs = _results()["runs"]
    earlier = [runs[1], {"config": "gone.py:preset", "topology": "h100:8"}, runs[0]]
    new = dict(runs[1], mix={"seconds": {}})
    kept = project.merged(earlier, [new])
    assert [r["config"] for r in kept] == [first, second] and kept[1]["mix"] == {"seconds": {}}
