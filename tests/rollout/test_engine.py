"""Multi-turn rollouts with a tiny random model, a small trained tokenizer and a scripted environment."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl import models
from searchrl.episode import Action, Env, Observation, SideBranch
from searchrl.rollout import generate
from searchrl.rollout.config import RolloutConfig, SamplingParams
from searchrl.rollout.engine import RolloutEngine
from searchrl.text.tokenizer import train_bpe_tokenizer
from tests.processes import free_port, wait, xla_flags_with_devices
from tests.rollout import engine_processes

REPO = Path(__file__).resolve().parents[2]

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`
TRAIN = models.Compute(models.TRAIN_RULES, ATTENTION)  # a default run's training layout and attention

WORDS = "alpha beta gamma delta search answer river mountain city house tree stone light water fire".split()


def build_tokenizer():
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 12)) for _ in range(300)]
    return train_bpe_tokenizer(texts, vocab_size=330)


def build_model(tokenizer):
    # Untied embeddings: a random tied model greedily repeats its last input token, which would hide bugs.
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer),
                              eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    return cfg, models.init_params(cfg, jax.random.key(1))


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_model(tokenizer)


@dataclasses.dataclass
class ScriptedEnv(Env):
    """Every turn looks something up, except that a turn ends the episode when its text has an even number of
    characters, and the turn after `max_turns` lookups always does.

    The rule is arbitrary but deterministic, so rows finish at different turns; observations echo the query length.
    With `branch_prompt`, a side branch ("note") runs after every lookup; with `separate` too, from its own
    prompt: the whole trajectory so far as text, then `branch_prompt`.
    """

    stop_strings: tuple[str, ...] = ("</search>", "</answer>")
    max_turns: int = 3
    branch_prompt: str | None = None
    separate: bool = False
    observed: list[int] = dataclasses.field(default_factory=list)

    @property
    def side_branch(self):
        if self.branch_prompt is None:
            return None
        return SideBranch("note", self.branch_prompt, ("</answer>",), max_tokens=4, after_kinds=("lookup",),
                          sampling=SamplingParams(temperature=0.0), separate_prompt=self.separate)

    def side_branch_prompt(self, example, turns):
        return self.prompt(example) + "".join(t.text + t.observation for t in turns) + self.branch_prompt

    def prompt(self, example):
        return f"question {example['q']} answer"

    def parse_action(self, text, turn_index):
        if len(text) % 2 == 0:
            return Action("reply", text, done=True)
        if turn_index < self.max_turns:
            return Action("lookup", text)
        return Action("invalid", "no tools in the final turn", done=True)

    def observe(self, actions):
        self.observed.append(len(actions))
        return [Observation(f" <information> river {len(a.content) % 7} stone </information> ",
                            {"q": a.content})
                for a in actions]


def make_engine(model, tokenizer, env, side_branch=True, mesh=None, dtype=None, **overrides):
    cfg, _ = model
    config = RolloutConfig(max_prompt_tokens=16, max_len=96, max_turn_tokens=6, max_obs_tokens=24,
                           obs_buckets=(8, 16, 32), chunk_steps=4, sampling=SamplingParams(temperature=1.0))
    return RolloutEngine(cfg, tokenizer, env, dataclasses.replace(config, **overrides), side_branch, dtype,
                         placement=models.Placement.default(mesh, ATTENTION))


EXAMPLES = [{"q": w} for w in WORDS[:6]]


def test_masks_spans_and_observations(model, tokenizer):
    env = ScriptedEnv()
    engine = make_engine(model, tokenizer, env)
    traj = engine.run(model[1], EXAMPLES, jax.random.key(0))
    assert len({len(t) for t in traj.turns}) > 1, "rows should finish at different turns"
    assert sum(env.observed) == sum(len(t) - 1 for t in traj.turns)  # every turn but the last was observed
    for b, turns in enumerate(traj.turns):
        expected_mask = np.zeros(traj.tokens.shape[1], np.float32)
        for turn in turns:
            expected_mask[turn.start:turn.end] = 1
        np.testing.assert_array_equal(traj.loss_mask[b], expected_mask)
        assert turns[0].start == traj.prompt_lengths[b]
        for prev, nxt in zip(turns, turns[1:]):  # the tokens between two turns are exactly the observation
            obs = tokenizer.decode(traj.tokens[b, prev.end:nxt.start])
            assert obs == f" <information> river {len(prev.action.content) % 7} stone </information> "
            assert prev.action.kind == "lookup" and prev.info == {"q": prev.action.content}
        last = turns[-1]
        assert traj.lengths[b] == last.end
        assert traj.finish_reasons[b] == "done" and last.action.done  # the env ended every episode
        assert last.action.kind == "reply" or len(turns) == env.max_turns + 1
        assert not traj.attention_mask[b, traj.lengths[b]:].any() and traj.attention_mask[b, :traj.lengths[b]].all()
        assert tokenizer.decode(traj.tokens[b, :traj.prompt_lengths[b]]) == env.prompt(EXAMPLES[b])


def test_sampler_logprobs_match_recomputation(model, tokenizer):
    cfg, params = model
    traj = make_engine(model, tokenizer, ScriptedEnv()).run(params, EXAMPLES, jax.random.key(3))
    tokens = jnp.asarray(traj.tokens)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    recomputed = models.token_logprobs(cfg, params, tokens, positions, jnp.asarray(traj.attention_mask),
                                       temperature=1.0, compute=TRAIN, remat=False,
                                       logits_chunk=0)
    policy = traj.loss_mask > 0
    assert policy.sum() > 20
    np.testing.assert_allclose(np.asarray(recomputed)[policy], traj.logprobs[policy], atol=1e-5, rtol=0)


def test_greedy_rollouts_are_deterministic_and_key_independent(model, tokenizer):
    greedy = SamplingParams(temperature=0.0)
    runs = [make_engine(model, tokenizer, ScriptedEnv(), sampling=greedy).run(model[1], EXAMPLES, jax.random.key(k))
            for k in (0, 1)]
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
    assert [[t.text for t in row] for row in runs[0].turns] == [[t.text for t in row] for row in runs[1].turns]


def _greedy_turn_tokens(model, tokenizer, env, **overrides):
    engine = make_engine(model, tokenizer, env, sampling=SamplingParams(temperature=0.0), **overrides)
    traj = engine.run(model[1], EXAMPLES[:1], jax.random.key(0))
    first = traj.turns[0][0]
    return traj, traj.tokens[0, first.start:first.end]


@pytest.mark.parametrize("chunk_steps", [1, 2, 32])
def test_multi_token_stop_across_chunk_boundaries(model, tokenizer, chunk_steps):
    # Greedy decoding is deterministic: take two consecutive tokens the model emits mid-turn as a stop string.
    _, free = _greedy_turn_tokens(model, tokenizer, ScriptedEnv(max_turns=0), max_turn_tokens=12)
    stop = tokenizer.decode(free[3:5])
    assert len(tokenizer.encode(stop, add_special_tokens=False)) >= 1
    env = ScriptedEnv(stop_strings=(stop,), max_turns=0)
    traj, stopped = _greedy_turn_tokens(model, tokenizer, env, max_turn_tokens=12, chunk_steps=chunk_steps)
    text = tokenizer.decode(stopped)
    assert text.endswith(stop) and text.count(stop) == 1
    assert text == tokenizer.decode(free)[: len(text)]
    assert len(stopped) <= 5


def test_text_stop_trims_tokens_past_the_stop(model, tokenizer):
    # A stop string ending strictly inside a sampled multi-character token can only be found on text; the turn is
    # trimmed after that token and its text cut at the stop.
    _, free = _greedy_turn_tokens(model, tokenizer, ScriptedEnv(max_turns=0), max_turn_tokens=12)
    text = tokenizer.decode(free)
    for i in range(len(free) - 1):
        before, through = tokenizer.decode(free[:i]), tokenizer.decode(free[:i + 1])
        stop = through[len(before):-1]
        if len(stop) >= 1 and text.find(stop) == len(before):
            break
    else:
        pytest.fail(f"no multi-character token in the greedy turn {text!r}")
    env = ScriptedEnv(stop_strings=(stop,), max_turns=0)
    traj, kept = _greedy_turn_tokens(model, tokenizer, env, max_turn_tokens=12)
    assert list(kept) == list(free[:i + 1])
    assert traj.turns[0][0].text == before + stop
    assert traj.loss_mask[0].sum() == i + 1 and traj.lengths[0] == traj.turns[0][0].end


def test_the_env_ends_episodes(model, tokenizer):
    env = ScriptedEnv(max_turns=1)
    traj = make_engine(model, tokenizer, env).run(model[1], EXAMPLES, jax.random.key(5))
    for turns, reason in zip(traj.turns, traj.finish_reasons):
        assert len(turns) <= 2 and reason == "done"
        if len(turns) == 2 and turns[-1].action.kind != "reply":
            assert turns[-1].action == Action("invalid", "no tools in the final turn", done=True)


def test_rows_that_run_out_of_slots_end_with_length(model, tokenizer):
    env = ScriptedEnv(max_turns=100)
    traj = make_engine(model, tokenizer, env, max_len=40).run(model[1], EXAMPLES, jax.random.key(5))
    assert "length" in traj.finish_reasons
    for turns, reason, length in zip(traj.turns, traj.finish_reasons, traj.lengths):
        assert (reason == "done") == turns[-1].action.done and length <= 40


def test_side_branch_runs_after_the_turns_it_names(model, tokenizer):
    env = ScriptedEnv(branch_prompt=" <answer>")
    traj = make_engine(model, tokenizer, env).run(model[1], EXAMPLES, jax.random.key(7))
    notes = [turn.info["note"] for turns in traj.turns for turn in turns if "note" in turn.info]
    lookups = [turn for turns in traj.turns for turn in turns
               if turn.action.kind == "lookup" and turn.observation]
    assert len(notes) == len(lookups) > 0 and any(notes)


@pytest.mark.parametrize("separate", [False, True])
def test_side_branch_leaves_the_trajectory_unchanged(model, tokenizer, separate):
    env = ScriptedEnv(branch_prompt=" <answer>", separate=separate)
    runs = [make_engine(model, tokenizer, env, side_branch=branch).run(model[1], EXAMPLES, jax.random.key(0))
            for branch in (False, True)]  # sampled at temperature 1: the branch must not touch the key either
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
    np.testing.assert_array_equal(runs[0].logprobs, runs[1].logprobs)
    assert [[t.text for t in row] for row in runs[0].turns] == \
        [[t.text for t in row] for row in runs[1].turns]
    assert not any("note" in t.info for row in runs[0].turns for t in row)
    assert any("note" in t.info for row in runs[1].turns for t in row)


def test_a_batch_split_in_two_samples_the_same_tokens(model, tokenizer):
    """At temperature 1, rows 0-3 and rows 4-7 rolled out apart (as two processes would, each with its rows'
    global index) equal the whole batch's rollout: a row's draws do not depend on the batch it is in."""
    examples = [{"q": w} for w in WORDS[:8]]
    engine = make_engine(model, tokenizer, ScriptedEnv(branch_prompt=" <answer>"))
    key = jax.random.key(4)
    whole = engine.run(model[1], examples, key)
    halves = [engine.run(model[1], examples[start:start + 4], key, first_row=start) for start in (0, 4)]
    np.testing.assert_array_equal(np.concatenate([h.tokens for h in halves]), whole.tokens)
    np.testing.assert_allclose(np.concatenate([h.logprobs for h in halves]), whole.logprobs, rtol=0, atol=1e-6)
    assert [row for h in halves for row in h.turns] == whole.turns
    assert len({tuple(t.text for t in row) for row in whole.turns}) > 4  # rows sampled differently
    shifted = engine.run(model[1], examples[4:], key)  # the same rows as rows 0-3 of a batch: other draws
    assert shifted.turns != halves[1].turns


@pytest.mark.parametrize("branch_prompt", [None, " <answer>"])
def test_a_chunked_prefill_samples_the_same_tokens(model, tokenizer, branch_prompt):
    """Prompts up to 3 times the widest chunk, prefilled a chunk at a time, give the one-call prefill's rollout
    (at temperature 1), and compile nothing past the warmup."""
    examples = [{"q": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(6 * i + 1))} for i in range(6)]
    widths = dict(max_prompt_tokens=48, max_len=128, obs_buckets=(8, 16), max_obs_tokens=16)
    longest = max(len(tokenizer.encode(ScriptedEnv().prompt(ex))) for ex in examples)
    assert 2 * 16 < longest <= 48
    runs = []
    for chunked in (False, True):
        engine = make_engine(model, tokenizer, ScriptedEnv(branch_prompt=branch_prompt), chunked_prefill=chunked,
                             **widths)
        engine.warmup(model[1], len(examples))
        warm = generate.compiled_programs()
        runs.append(engine.run(model[1], examples, jax.random.key(5)))
        assert generate.compiled_programs() == warm
    np.testing.assert_array_equal(runs[1].tokens, runs[0].tokens)
    np.testing.assert_allclose(runs[1].logprobs, runs[0].logprobs, rtol=0, atol=1e-6)
    assert runs[1].turns == runs[0].turns


@pytest.mark.parametrize("branch_prompt,separate,rows", [(None, False, 0), (" <answer>", False, 0),
                                                        (" <answer>", True, 0), (" <answer>", False, 4)])
def test_nothing_compiles_after_warmup(model, tokenizer, branch_prompt, separate, rows):
    engine = make_engine(model, tokenizer, ScriptedEnv(branch_prompt=branch_prompt, separate=separate),
                         decode_rows=rows)
    before = generate.compiled_programs()
    engine.warmup(model[1], len(EXAMPLES))
    warm = generate.compiled_programs()
    # (4 chunk widths + prompt) x 2 samplers + the decoder + truncate, reset, progress, the page tables,
    # the page copies and the state copy, at most
    assert warm - before <= 17
    for seed in range(4):  # multi-turn runs over every observation bucket, side branches included
        engine.run(model[1], EXAMPLES, jax.random.key(seed))
    assert generate.compiled_programs() == warm


def assert_same_episodes(got, want, rows=None):
    """Episodes `rows` of `got` equal `want`'s bit for bit: tokens, log-probs, turns and side branches."""
    rows = range(len(want.turns)) if rows is None else rows
    np.testing.assert_array_equal(got.tokens[rows], want.tokens)
    np.testing.assert_array_equal(got.logprobs[rows], want.logprobs)
    np.testing.assert_array_equal(got.loss_mask[rows], want.loss_mask)
    assert [got.turns[b] for b in rows] == want.turns
    assert [got.finish_reasons[b] for b in rows] == want.finish_reasons


@pytest.mark.parametrize("separate,extend_rows,parked_rows", [(False, 0, 0), (True, 0, 0), (False, 2, 2)])
def test_refilled_rows_run_each_episode_as_it_runs_alone(model, tokenizer, separate, extend_rows,
                                                         parked_rows):
    """At temperature 1, 8 episodes on 3 decode rows (rows refilled as episodes end, observations appended
    as they arrive, on all rows or 2 a call; rows waiting for the env parked) are, one by one, the episode
    run alone on the same 3 rows, side branch included; the lock-step schedule runs the same episodes;
    nothing compiles past the warm-up."""
    examples = [{"q": w} for w in WORDS[:8]]
    key = jax.random.key(6)
    runs = {}
    for schedule in ("continuous", "lockstep"):
        engine = make_engine(model, tokenizer, ScriptedEnv(branch_prompt=" <answer>", separate=separate),
                             decode_rows=3, schedule=schedule, extend_rows=extend_rows,
                             parked_rows=parked_rows)
        engine.warmup(model[1], len(examples))
        warm = generate.compiled_programs()
        runs[schedule] = engine.run(model[1], examples, key)
        assert generate.compiled_programs() == warm
        assert 0 < engine.stats.utilisation <= 1 and engine.stats.episodes == len(examples)
        assert (engine.stats.parks > 0) == (parked_rows > 0 and schedule == "continuous")
    traj = runs["continuous"]
    assert len({len(t) for t in traj.turns}) > 1 and any("note" in t.info for row in traj.turns for t in row)
    assert_same_episodes(runs["lockstep"], traj)
    for b in range(len(examples)):
        alone = engine.run(model[1], examples[b:b + 1], key, first_row=b)
        assert_same_episodes(traj, alone, [b])


def test_a_sharded_continuous_rollout_runs_each_episode_as_it_runs_alone(model, tokenizer):
    """The same on the (data 2, fsdp 2, tensor 2) mesh: 8 episodes on 4 decode rows (one per row block),
    appended to 2 rows a call, with 2 parked rows (a side branch late for a row takes its episode's)."""
    examples = [{"q": w} for w in WORDS[:8]]
    engine = make_engine(model, tokenizer, ScriptedEnv(branch_prompt=" <answer>"),
                         mesh=models.make_mesh(2, 2, 2), decode_rows=4, extend_rows=2, parked_rows=2)
    key = jax.random.key(2)
    traj = engine.run(model[1], examples, key)
    assert len({len(t) for t in traj.turns}) > 1 and engine.stats.parks > 0
    # a side branch still waiting for a row when its episode's observation came in took the episode's row
    assert engine.stats.yields > 0 and engine.stats.asides == 0
    for b in (0, 5, 7):
        assert_same_episodes(traj, engine.run(model[1], examples[b:b + 1], key, first_row=b), [b])


@pytest.mark.parametrize("mesh", [None, (2, 2, 2)], ids=["one_device", "mesh"])
def test_rows_short_of_pages_wait_and_run_each_episode_as_it_runs_alone(model, tokenizer, mesh):
    """Pools of one episode's largest size (the least allowed: one episode at a time) and (one device) of 12
    pages more, for 4 decode rows (8 on the mesh: 2 a device): rows wait for pages (decode chunks sat out,
    observations and prompts held back), the oldest episode always goes on, and every episode, side branch
    included, is the episode run with pages to spare, bit for bit, on one device and on the (data 2, fsdp 2,
    tensor 2) mesh, under both schedules. A pool too small for one episode is refused."""
    examples = [{"q": w} for w in WORDS[:8]]
    key = jax.random.key(4)
    mesh = None if mesh is None else models.make_mesh(*mesh)
    env = ScriptedEnv(branch_prompt=" <answer>", max_turns=4)
    settings = dict(mesh=mesh, decode_rows=4 if mesh is None else 8, extend_rows=2, page_size=4)
    roomy = make_engine(model, tokenizer, env, **settings)
    want = roomy.run(model[1], examples, key)
    assert roomy.stats.page_waits == 0
    # with 12 pages more a device, the mesh's 2 episodes a device never run short
    cases = [(0, "continuous"), (0, "lockstep")] + ([(12, "continuous"), (12, "lockstep")] if mesh is None else [])
    for extra, schedule in cases:
        engine = make_engine(model, tokenizer, env, schedule=schedule, pool_pages=roomy.reserve() + extra,
                             **settings)
        assert_same_episodes(engine.run(model[1], examples, key), want)
        assert engine.stats.page_waits > 0
    for b in (0, 3, 6):
        assert_same_episodes(want, roomy.run(model[1], examples[b:b + 1], key, first_row=b), [b])
    with pytest.raises(ValueError, match="cannot hold one episode"):
        make_engine(model, tokenizer, env, pool_pages=roomy.reserve() - 1, **settings).run(model[1], examples, key)


@pytest.mark.parametrize("mesh,chunked_prefill", [(None, False), (None, True), ((2, 2, 2), False)],
                         ids=["one_device", "chunked_prefill", "mesh"])
def test_a_grpo_group_prefills_its_prompt_once_and_each_response_is_its_episode_alone(model, tokenizer, mesh,
                                                                                       chunked_prefill):
    """Three prompts of two responses each: the second response of a group starting beside the first
    shares its prompt's pages (no prefill of its own) and still samples what it samples alone, bit for bit,
    side branches, refills and pool exhaustion included."""
    examples = [{"q": w} for w in WORDS[:3] for _ in range(2)]
    mesh = None if mesh is None else models.make_mesh(*mesh)
    env = ScriptedEnv(branch_prompt=" <answer>", max_turns=3)
    settings = dict(mesh=mesh, decode_rows=4 if mesh is None else 8, extend_rows=2, page_size=4,
                    chunked_prefill=chunked_prefill)
    key = jax.random.key(5)
    engine = make_engine(model, tokenizer, env, **settings)
    got = engine.run(model[1], examples, key)
    assert engine.stats.shared_prompts >= 2
    alone = make_engine(model, tokenizer, env, **settings)
    for b in range(len(examples)):
        assert_same_episodes(got, alone.run(model[1], examples[b:b + 1], key, first_row=b), [b])
    assert alone.stats.shared_prompts == 0
    if mesh is None:  # one episode's pages at a time: the group's second response waits for its own
        tight = make_engine(model, tokenizer, env, pool_pages=engine.reserve(), **settings)
        assert_same_episodes(tight.run(model[1], examples, key), got)
        assert tight.stats.page_waits > 0


GRPO_EXAMPLES = [{"q": w} for w in WORDS[:4] for _ in range(2)]  # four prompts, two responses each


def test_a_grpo_rollout_as_two_processes_is_the_one_process_rollout(tmp_path):
    """Two processes (gloo on 127.0.0.1, 4 CPU devices each), each rolling out its half of a GRPO batch on
    its block of the (2, 2, 2) mesh with its groups sharing prompt pages, give the one-process rollout's
    episodes bit for bit."""
    port, out = free_port(), tmp_path
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), "XLA_FLAGS": xla_flags_with_devices(4)}
    with open(out / "log", "w") as log:
        procs = [subprocess.Popen([sys.executable, "-m", "tests.rollout.engine_processes", str(out), str(i), "2",
                                   str(port)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
                 for i in range(2)]
    wait(procs, [out, out])
    want_arrays, want = engine_processes.rollout(slice(0, len(GRPO_EXAMPLES)))
    assert want["shared_prompts"] >= 2
    halves = [(np.load(out / f"process{i}.npz"), json.loads((out / f"process{i}.json").read_text()))
              for i in range(2)]
    for name, array in want_arrays.items():
        np.testing.assert_array_equal(np.concatenate([arrays[name] for arrays, _ in halves]), array)
    for name in ("turns", "finish"):
        assert [row for _, texts in halves for row in texts[name]] == want[name]
    assert all(texts["shared_prompts"] >= 1 for _, texts in halves)


def test_a_separate_branch_prompt_goes_on_in_the_smallest_pool(model, tokenizer):
    """With one decode row and a pool of one episode's largest size, a side branch from its own prompt
    (sharing no page) is counted in its episode's family: it starts, and the rollout equals a roomy one."""
    env = ScriptedEnv(branch_prompt=" <answer>", separate=True)
    key = jax.random.key(2)
    tight = make_engine(model, tokenizer, env, decode_rows=1)
    assert tight.pool_pages(1) == tight.reserve()
    want = make_engine(model, tokenizer, env, decode_rows=1, pool_pages=3 * tight.reserve()).run(
        model[1], EXAMPLES[:3], key)
    got = tight.run(model[1], EXAMPLES[:3], key)
    assert any("note" in t.info for row in got.turns for t in row)
    assert_same_episodes(got, want)


def test_a_rollout_that_cannot_go_on_is_a_clear_error(model, tokenizer, monkeypatch):
    """A round that changes no row with no env call out would repeat forever: it is an error instead."""
    from searchrl.rollout import pages
    monkeypatch.setattr(pages.PagePool, "grow", lambda *args: False)  # no prompt ever gets its pages
    with pytest.raises(RuntimeError, match="Rollout stalled: no row could go on"):
        make_engine(model, tokenizer, ScriptedEnv()).run(model[1], EXAMPLES[:2], jax.random.key(0))


def test_prompt_too_long_is_a_clear_error(model, tokenizer):
    engine = make_engine(model, tokenizer, ScriptedEnv(), max_prompt_tokens=4)
    with pytest.raises(ValueError, match="Example 0: prompt has"):
        engine.run(model[1], EXAMPLES[:1], jax.random.key(0))


def test_observation_truncation_keeps_only_a_real_closing_tag(model, tokenizer):
    engine = make_engine(model, tokenizer, ScriptedEnv())
    long_info = Observation(" <information> " + "river stone " * 40 + "</information>\n\n")
    ids = engine._observation_tokens(long_info, room=100)
    assert len(ids) == 24 and tokenizer.decode(ids).endswith("</information>\n\n")
    message = Observation("invalid: put the answer between <answer> and </answer>. Let me try again. " * 4)
    ids = engine._observation_tokens(message, room=100)
    assert len(ids) == 24 and tokenizer.decode(ids) == tokenizer.decode(tokenizer.encode(message.text)[:24])


def test_cropped_trajectory_keeps_every_token(model, tokenizer):
    traj = make_engine(model, tokenizer, ScriptedEnv()).run(model[1], EXAMPLES, jax.random.key(2))
    width = int(traj.lengths.max())
    cropped = traj.cropped(width)
    assert cropped.tokens.shape == (len(EXAMPLES), width)
    np.testing.assert_array_equal(cropped.loss_mask, traj.loss_mask[:, :width])
    assert traj.loss_mask[:, width:].sum() == 0 and cropped.turns is traj.turns
    with pytest.raises(ValueError, match="Cannot crop"):
        traj.cropped(width - 1)


def test_a_sharded_rollout_matches_one_device_without_host_transfers(model, tokenizer):
    """A (data 2, fsdp 2, tensor 2) mesh over the 8 test devices: rows over data x fsdp, heads over tensor,
    params handed over from the trainer's FSDP layout; greedy tokens as on one device, side branch included,
    and no implicit transfer between host and device anywhere in the rollout."""
    cfg, params = model
    examples = [{"q": w} for w in WORDS[:8]]
    greedy = SamplingParams(temperature=0.0)

    def env():
        return ScriptedEnv(branch_prompt=" note <answer>", separate=True)  # copies, truncates, re-prompts

    one = make_engine(model, tokenizer, env(), sampling=greedy).run(params, examples, jax.random.key(0))
    mesh = models.make_mesh(2, 2, 2)
    engine = make_engine(model, tokenizer, env(), mesh=mesh, sampling=greedy)
    trainer_layout = jax.device_put(params, models.param_shardings(cfg, mesh, models.TRAIN_RULES))
    key = jax.random.key(0)
    with jax.transfer_guard("disallow"):
        engine.warmup(trainer_layout, len(examples))
        sharded = engine.run(trainer_layout, examples, key)
    np.testing.assert_array_equal(sharded.tokens, one.tokens)
    assert [[(t.text, t.info) for t in row] for row in sharded.turns] == \
        [[(t.text, t.info) for t in row] for row in one.turns]
    state, pool = engine._new_state(len(examples), key), engine._new_pool(trainer_layout, len(examples))
    assert spec_of(pool.k[0]) == ("tensor", ("data", "fsdp"), None, None)  # pages beside their rows
    assert spec_of(state.tokens) == spec_of(state.pages) == (("data", "fsdp"), None)
    q = engine.sampling_params(trainer_layout)["layers_0"]["q"]
    assert spec_of(q) == (None, "tensor", None)  # whole on every data replica


def spec_of(x: jax.Array) -> tuple:
    """An array's partition spec, one entry per dimension."""
    spec = tuple(x.sharding.spec)
    return spec + (None,) * (x.ndim - len(spec))


def test_the_rollout_samples_in_the_compute_dtype(model, tokenizer):
    """With dtype="bfloat16" (the trainer's rl.compute_dtype), float32 master params are cast on device and the
    KV cache is bf16; the sampler's log-probs are those of the bf16 model, as the update scores them, to
    bfloat16's rounding."""
    cfg, params = model
    engine = make_engine(model, tokenizer, ScriptedEnv(), dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(engine.sampling_params(params))} == {jnp.dtype(jnp.bfloat16)}
    sampled = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    assert engine._new_pool(sampled, 2).k[0].dtype == jnp.bfloat16
    traj = engine.run(params, EXAMPLES, jax.random.key(3))
    tokens = jnp.asarray(traj.tokens)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    policy = traj.loss_mask > 0

    def gap(weights):
        recomputed = models.token_logprobs(cfg, weights, tokens, positions, jnp.asarray(traj.attention_mask),
                                           temperature=1.0, compute=TRAIN, remat=False,
                                           logits_chunk=0)
        return float(np.abs(np.asarray(recomputed)[policy] - traj.logprobs[policy]).max())

    # Within bfloat16's rounding of the update's scores (measured: 2.8e-3). The rollout's paged attention
    # normalises its online softmax after rounding each page's probabilities, the update's attention before:
    # the two round differently, by as much as the float32 model differs (2.8e-3 too).
    assert gap(sampled) < 5e-3
