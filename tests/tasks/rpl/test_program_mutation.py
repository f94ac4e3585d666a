"""Program mutation inside an RL run: weak programs are mutated and verified against the real BM25 index,
the verified mutants are distilled into the trainer's policy, and RL resumes from it; as two processes, it
keeps and distils what one process does."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from searchrl import models
from searchrl.configlib import from_config
from searchrl.episode import Action
from searchrl.metric_writer import read_metrics
from searchrl.tasks.rpl import distill as program_mutation
from searchrl.tasks.rpl import env as rpl
from searchrl.tasks.rpl.config import MutationConfig
from searchrl.tasks.rpl.sandbox import execute
from searchrl.text import tags
from tests.tasks.rpl.mutation_world import (BEST, CITIES, ScriptedEngine, build_trainer, mutate_and_distill,
                                      scripted_answers)
from tests.processes import free_port, wait, xla_flags_with_devices

TRAIN = models.Compute(models.TRAIN_RULES, models.AttentionConfig())  # as a default run trains

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    out = build_trainer(tmp_path_factory.mktemp("pm"))
    yield out
    out.close()


def test_program_frame_is_the_turn_around_the_program_source():
    turn = "<think>x</think><program>\n```python\nshow(sparse_retrieval('a', 2))\n```\n</program>"
    frame, source = program_mutation.program_frame(turn)
    assert source == "show(sparse_retrieval('a', 2))" == rpl.program_source(tags.blocks(turn, rpl.PROGRAM)[0])
    assert frame == ("<think>x</think><program>\n```python\n", "\n```\n</program>")
    assert frame[0] + source + frame[1] == turn


def test_weak_programs_are_mutated_verified_and_turned_into_sft_examples(trainer, monkeypatch):
    """The policy's answers stand in (the random policy answers nothing; its greedy turns are tested below).
    Rows 0-3 write the weak program of their city, row 4 (arno again) the best one. Against the gold of 4
    documents, the rolled-out episodes score 0 (no answer: arno, beni, arno) and 2/3 (cora, dune). With the
    best programs found, arno's answer (1 of 4: F1 0.4) beats 0, beni's turn is no answer, cora's (3 of 4:
    6/7) beats 2/3, dune's (0.4) does not, and the second arno's (all 4) beats 0: rows 0 and 2 are kept with
    their variants, row 4 with its own program, unless `keep_unimproved` is off; with `distil_answers` off the
    same examples end at their program turns."""
    answers = ["<answer> arno0 </answer>", None, "<answer> cora0, cora1, cora2 </answer>",
               "<answer> dune0 </answer>", "<answer> arno0, arno1, arno2, arno3 </answer>"]
    asked = []

    def policy_answers(run, prefixes, key, greedy=True):
        asked.append(prefixes)
        return answers[:len(prefixes)]
    monkeypatch.setattr(program_mutation, "policy_answers", policy_answers)
    config, rows = MutationConfig(max_variants=64, max_shown=4), trainer.train_examples[:5]
    monkeypatch.setattr(trainer, "engine", ScriptedEngine(trainer.engine))
    segments, counts = program_mutation.mutation_examples(trainer.handle(), rows, config, jax.random.key(0))
    variants_only, _ = program_mutation.mutation_examples(
        trainer.handle(), rows, dataclasses.replace(config, keep_unimproved=False), jax.random.key(0))
    programs_only, _ = program_mutation.mutation_examples(
        trainer.handle(), rows, dataclasses.replace(config, distil_answers=False), jax.random.key(0))
    # one round each
    assert counts == {"programs": 5.0, "weak": 4.0, "improved": 4.0, "edits": 4.0, "answered": 4.0,
                      "variants": 2.0}
    assert [len(prefixes) for prefixes in asked] == [5, 4, 5]
    assert len(segments) == 3 and variants_only == segments[:2]
    assert programs_only == [example[:2] for example in segments]  # the program turns alone
    for example, i in zip(segments, (0, 2, 4)):
        (prompt, is_prompt_policy), (turn, is_policy), (seen, is_seen_policy), answer = example
        assert not is_prompt_policy and is_policy and not is_seen_policy
        city = prompt.strip()[-4:]
        assert city == (CITIES * 2)[i]
        assert answer == (answers[i], True)
        [observation] = trainer.env.observe([trainer.env.parse_action(turn, 0)])
        used = len(trainer.engine.tokenizer.encode(prompt + turn, add_special_tokens=False))
        assert seen == trainer.engine.observation_text(observation, used)  # as a rollout shows it: truncated
        assert asked[0][i] == prompt + turn + seen and len(seen) < len(observation.text)
        assert turn.startswith("<think>go</think><program> ") and turn.endswith("\n</program>")  # as written
        source = rpl.program_source(tags.blocks(turn, rpl.PROGRAM)[0])
        if i == 4:
            assert source == BEST.format(city=city)  # the policy's own
            continue
        result = execute(source, trainer.env.sdk, trainer.env.config.limits)
        assert result.error is None and len(result.shown) <= 4
        assert rpl.set_f1([h.id for h in result.shown], [f"{city}{i}" for i in range(4)]) > 2 / 3  # was 2/3


def test_the_best_of_several_answers_is_distilled(trainer, monkeypatch):
    """With `answer_samples=3` each program's answer is the best-scoring of the greedy answer and two sampled
    ones (the greedy one first among equals); a program counts as answered when any try is an answer. Against
    the gold of 4 documents, with the best programs found: arno's tries score 0.4, 6/7 and 2/3 (the second
    is kept); beni answers only in a sample (all 4: kept); cora's three tries score 6/7 (the greedy text is
    kept); dune's best, 0.4, is below its rolled-out 2/3 (dropped); the second arno keeps its greedy 0.4."""
    def turn(*docs):
        return f"<answer> {', '.join(docs)} </answer>" if docs else None
    tries = [[turn("arno0"), turn(), turn("cora0", "cora1", "cora2"), turn("dune0"), turn("arno0")],
             [turn("arno0", "arno1", "arno2"), turn("beni0", "beni1", "beni2", "beni3"),
              turn("cora0", "cora1", "cora2"), turn(), turn("arno0")],
             [turn("arno0", "arno1"), turn(), turn("cora3", "cora2", "cora1"), turn("dune0"), turn("nobody")]]
    calls = []

    def policy_answers(run, prefixes, key, greedy=True):
        calls.append((prefixes, jax.random.key_data(key).tolist(), greedy))
        return tries[len(calls) - 1][:len(prefixes)]
    monkeypatch.setattr(program_mutation, "policy_answers", policy_answers)
    config = MutationConfig(max_variants=64, max_shown=4, answer_samples=3)
    monkeypatch.setattr(trainer, "engine", ScriptedEngine(trainer.engine))
    segments, counts = program_mutation.mutation_examples(trainer.handle(), trainer.train_examples[:5], config,
                                                          jax.random.key(0))
    assert [greedy for _, _, greedy in calls] == [True, False, False]
    assert calls[0][0] == calls[1][0] == calls[2][0] and len(calls[0][0]) == 5
    assert len({str(key) for _, key, _ in calls}) == 3  # each try its own key
    assert counts["answered"] == 5.0 and counts["variants"] == 3.0
    assert [example[-1] for example in segments] == [(tries[1][0], True), (tries[1][1], True),
                                                     (tries[0][2], True), (tries[0][4], True)]
    assert [example[0][0].strip()[-4:] for example in segments] == ["arno", "beni", "cora", "arno"]
    with pytest.raises(ValueError, match=r"answer_samples=0 is out of range: allowed \[1, inf\)"):
        MutationConfig(answer_samples=0)


def test_policy_answers_are_the_greedy_continuation_of_each_prefix(trainer, monkeypatch):
    """Every turn counts as an answer here (the random policy writes none): each is the greedy decode of
    the prefix, token by token with the full forward pass, cut after the first stop string."""
    monkeypatch.setattr(trainer.env, "parse_action", lambda text, turn: Action(tags.ANSWER, text, done=True))
    tokenizer, cfg = trainer.engine.tokenizer, trainer.model_cfg
    prefixes = ["which organisations are in arno\n<program> show(sparse_retrieval('arno', 2)) </program>",
                "which organisations are in cora\n"]
    params = jax.device_get(trainer.state.policy)
    expected = []
    for prefix in prefixes:
        ids = tokenizer.encode(prefix, add_special_tokens=False)
        start = len(ids)
        for _ in range(trainer.engine.config.max_turn_tokens):
            tokens = np.asarray(ids)[None]
            positions = np.arange(len(ids))[None]
            logits, _, _ = models.forward(cfg, params, tokens, positions, np.ones_like(tokens, bool),
                                          compute=TRAIN, remat=False)
            ids.append(int(np.argmax(logits[0, -1])))
            text = tokenizer.decode(ids[start:])
            if ids[-1] == cfg.eos_token_id or any(stop in text for stop in trainer.env.stop_strings):
                break
        stops = [text.index(s) + len(s) for s in trainer.env.stop_strings if s in text]
        expected.append(text[:min(stops)] if stops else text)
    assert program_mutation.policy_answers(trainer.handle(), prefixes, jax.random.key(1)) == expected
    sampled = program_mutation.policy_answers(trainer.handle(), prefixes, jax.random.key(1), greedy=False)
    assert sampled == program_mutation.policy_answers(trainer.handle(), prefixes, jax.random.key(1), greedy=False)
    assert sampled != expected  # the random policy's samples (temperature 1) are not its greedy turns


def test_distillation_replaces_the_policy_and_the_train_hook_resumes_rl(trainer):
    sft = {"steps": 2, "batch_size": 8, "max_len": 48}
    config = from_config(MutationConfig, {"at_step": 1, "episodes": 8, "sft": sft}, "config.env.mutation")
    before = jax.device_get(trainer.state.policy)
    segments = [[("which organisations are in arno\n", False),
                 (tags.block(tags.PROGRAM, "show(sparse_retrieval('arno', 4))"), True)]] * 8
    losses = program_mutation.distill(trainer.handle(), segments, config)
    assert len(losses) == 2 and np.isfinite(losses).all()
    after = trainer.state.policy
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), after, before))
    assert any(changed)
    shardings = jax.tree.leaves(jax.tree.map(lambda a: a.sharding, after))
    assert all(s.mesh.shape == trainer.mesh.shape for s in shardings)
    trainer.hooks = [program_mutation.ProgramMutation(config)]
    history = trainer.train()
    assert len(history) >= 1 and trainer.step_count == trainer.train_config.steps
    rows = read_metrics(f"{trainer.workdir}/metrics.jsonl")
    mutation_rows = [r for r in rows if "mutation/programs" in r]
    assert len(mutation_rows) == 1 and mutation_rows[0]["step"] == 1


@pytest.mark.slow
def test_two_processes_mutate_and_distill_like_one(tmp_path, monkeypatch):
    """Program mutation and its distillation as two processes (4 devices each, a (2, 2, 2) mesh): each rolls
    out, mutates and answers its own rows (process 0 the weak programs, process 1 the best ones), every
    process gets all kept trajectories, and SFT feeds each process's rows of every minibatch; the result, and
    the distilled policy saved as a Hugging Face model (process 0 writes), are one process's on 8 devices."""
    port, two = free_port(), tmp_path / "two"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
           "XLA_FLAGS": xla_flags_with_devices(4)}
    two.mkdir()
    with open(two / "log", "w") as log:
        procs = [subprocess.Popen([sys.executable, "-m", "tests.tasks.rpl.mutation_world", str(two), str(i),
                                   "2", str(port)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
                 for i in range(2)]
    try:
        monkeypatch.setattr(program_mutation, "policy_answers", scripted_answers)
        alone = build_trainer(tmp_path / "one", mesh=(2, 2, 2))  # one process, 8 devices
        alone.engine = ScriptedEngine(alone.engine)
        try:
            one = mutate_and_distill(alone, tmp_path / "one" / "hf")
        finally:
            alone.close()
    finally:
        wait(procs, [two, two])
    got = json.loads((two / "result.json").read_text())

    # arno and cora: improved and answered better than rolled out (rows 0, 2) and, unimproved, better than
    # the episodes that did not answer (rows 4, 6); dune's unimproved program too (row 7)
    assert one["counts"] == {"programs": 8.0, "weak": 4.0, "improved": 4.0, "edits": 4.0, "answered": 6.0,
                             "variants": 2.0}
    assert [s[0][0].strip()[-4:] for s in one["segments"]] == ["arno", "cora", "arno", "cora", "dune"]
    assert one["rows_run"] == [list(range(8))] and got["rows_run"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert got["counts"] == one["counts"]
    assert got["segments"] == [[list(segment) for segment in s] for s in one["segments"]]
    np.testing.assert_allclose(got["losses"], one["losses"], rtol=1e-5)
    want, saved = (load_file(root / "hf" / "model.safetensors") for root in (tmp_path / "one", two))
    assert sorted(saved) == sorted(want)
    for name, tensor in want.items():
        np.testing.assert_allclose(saved[name], tensor, rtol=0, atol=1e-6, err_msg=name)


def test_figures_4_and_5_from_the_tiny_runs_metrics(trainer, tmp_path):
    """RPL's Figures 4 and 5 drawn from the tiny run's metrics.jsonl (one more step logs the step time too);
    every number drawn is the run's own log, recomputed here."""
    from searchrl.tasks.rpl import figures

    trainer.train(trainer.step_count + 1)
    rows = [r for r in read_metrics(f"{trainer.workdir}/metrics.jsonl") if "perf/step_seconds" in r]
    # the trainer's context and retrieval-turn logs are the RPL env's own on every step
    assert all(r["rollout/context_tokens"] == r["env/context_tokens"] for r in rows)
    assert all(r["rollout/retrieval_turns"] == r["env/retrieval_turns"] for r in rows)
    numbers = figures.write_figures({"rpl": trainer.workdir, "again": trainer.workdir}, tmp_path, "env")
    assert (tmp_path / "figure4.png").stat().st_size > 1000 and (tmp_path / "figure5.png").stat().st_size > 1000
    assert json.loads((tmp_path / "figures.json").read_text())["figure4"] == numbers["figure4"]
    for metric, _ in figures.EFFICIENCY:
        values = [r[metric] for r in rows if metric in r]
        assert values and numbers["figure4"][metric]["rpl"] == numbers["figure4"][metric]["again"]
        mean, midpoint = sum(values) / len(values), (min(values) + max(values)) / 2
        assert numbers["figure4"][metric]["rpl"]["mean"] == pytest.approx(mean)
        # a metric that is 0 on every step (the untrained policy makes no retrieval turn) is left unscaled
        assert numbers["figure4"][metric]["rpl"]["normalized"] == pytest.approx(mean / (midpoint or 1.0))
    sparse = numbers["figure5"]["uses_sparse_retrieval"]["rpl"]
    assert sparse == [(r["step"], 100 * r["env/uses_sparse_retrieval"]) for r in rows]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    with pytest.raises(ValueError, match=r"other/metrics.jsonl \(other\) has no 'rollout/context_tokens'"):
        figures.efficiency({"rpl": trainer.workdir, "other": str(tmp_path / "other")})
