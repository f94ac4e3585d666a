"""Rollout throughput: searchrl's jitted chunked generation against transformers' `generate`, and a search rollout.

(a) plain greedy generation, batch 16 x 128 new tokens, same random weights and dtype on both sides, on the same
    kind of device (PyTorch on CUDA when JAX runs on a GPU), in interleaved rounds (`interleave`: the median
    ratio and its range); on a known accelerator (`device_chip`), the share of its HBM bandwidth that
    searchrl's decode steps use (`decode_step_bytes` a step);
(b) a 4-turn search rollout against BM25 (or dense retrieval: FAISS, on the GPU where FAISS has one) over a
    generated corpus: the share of wall time spent outside jitted compute (host: parsing, retrieval,
    tokenising, Python), and the largest gap between the sampler's log-probabilities and the trainer's
    recomputation of them;
(c) programs compiled after `RolloutEngine.warmup` (should be 0);
(d) a long tail: `--episodes` multi-turn episodes whose number of tool calls is 1, 2, 3 or 4 with
    probabilities 40/30/20/10% (drawn per turn from a hash of the turn's text, so both engines see the same
    episodes), each call a BM25 search behind `--latency_ms` of waiting (as a remote server adds), on
    `--decode_rows` decode rows: the lock-step schedule (a row waits for its batch's slowest; rows refilled
    only once all are free) against continuous batching (a row refilled as soon as its episode ends, its
    tool calls overlapped with decoding, rows waiting for them parked in `--parked_rows` rows), both
    appending `--extend_rows` rows a call, in interleaved rounds: episodes/s (median ratio and range), decode
    slot utilisation, the device's idle share waiting for the host, compiles after warm-up.
(i) the long tail of (d) with AutoSearch's intermediate answers after every search (`--answer_tokens`, greedy;
    each a side branch forked from its episode and decoded beside the others) against the same workload
    without them: episodes/s (median ratio and range), utilisation;
(s) decode scaling: one decode step of `--batch` rows holding `--scaling_live` tokens each, with 512 and with
    8,192 slots reserved a row (`--scaling_slots`), in interleaved rounds: ms a step and the cost ratio
    (paged, a step reads the live pages only).
Run: `python -m searchrl.benchmarks.rollout [--json] [--parts abds] [--preset bench_small] [--passages 20000]
[--retriever dense] [--encoder DIR] [--dtype bfloat16]` (`--parts a` measures generation only; b and c share
one run).
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from searchrl import cli, models
from searchrl.benchmarks import rollout_report
from searchrl.benchmarks.hardware import device_chip, device_name
from searchrl.benchmarks.interleave import compare, describe
from searchrl.benchmarks.jaxpr_cost import matmul_cost
from searchrl.benchmarks.model import torch_device
from searchrl.benchmarks.retrieval import default_encoder, make_queries, random_encoder, synthetic_corpus
from searchrl.episode import Action, Env, Observation, SideBranch, Trajectory, Turn
from searchrl.models.paged_attention import pages_a_step
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.dense import DenseRetriever
from searchrl.rollout import generate
from searchrl.rollout.config import RolloutConfig, SamplingParams
from searchrl.rollout.engine import RolloutEngine
from searchrl.text import tags
from searchrl.text.tokenizer import train_bpe_tokenizer

_NEVER = [[-2]]  # a stop/EOS id no token has: generation runs to its budget, as with min_new_tokens
_NO_EOS = np.asarray([-2], np.int32)
# One device, no mesh: the layouts of a default run's config place nothing here.
_PLACEMENT = models.Placement.default()


def _generation(cfg: models.ModelConfig, batch: int, prompt_len: int, new_tokens: int, slots: int = 0,
                dtype=jnp.float32) -> tuple[models.KVPool, generate.GenState, generate.DecodeSpec]:
    """The empty pool and generation state and the decode spec of `searchrl_generate`: rows of `slots`
    slots (default: the prompt and the new tokens) holding the pages of the prompt and the new tokens."""
    used = prompt_len + new_tokens + 1
    spec = generate.DecodeSpec(new_tokens, max(slots, used) - 1, SamplingParams(temperature=0.0),
                               steps=new_tokens, compute=_PLACEMENT.sample)
    page_size = RolloutConfig.page_size
    pages, held = generate.owned_pages(batch, used, page_size)
    state = generate.init_state(batch, max(slots, used), page_size, jax.random.key(0))
    table = np.zeros(state.pages.shape, np.int32)
    table[:, :held.shape[1]] = held
    return models.KVPool.init(cfg, pages, page_size, dtype), state._replace(pages=jnp.asarray(table)), spec


def _prefilled(cfg: models.ModelConfig, params, prompts: np.ndarray, new_tokens: int, slots: int = 0
               ) -> tuple[models.KVPool, generate.GenState, generate.DecodeSpec]:
    batch, prompt_len = prompts.shape
    dtype = jax.tree.leaves(params)[0].dtype
    pool, state, spec = _generation(cfg, batch, prompt_len, new_tokens, slots, dtype)
    lengths = np.full((batch,), prompt_len, np.int32)
    pool, state = generate.extend(cfg, params, pool, state, None, prompts, lengths, np.ones(batch, bool),
                                  spec.sampling, spec.compute)
    return pool, state, spec


def searchrl_generate(cfg: models.ModelConfig, params, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
    """Greedy generation of exactly `new_tokens` per row with prefill + one decode chunk (`params`
    unstacked: `models.unstack_layers`)."""
    pool, state, spec = _prefilled(cfg, params, prompts, new_tokens)
    _, state = generate.decode_chunk(cfg, params, pool, state, np.ones(len(prompts), bool),
                                     (generate.stop_table(_NEVER),), _NO_EOS, spec)
    prompt_len = prompts.shape[1]
    return np.asarray(state.tokens[:, prompt_len:prompt_len + new_tokens])


def decode_step_bytes(cfg: models.ModelConfig, params, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Bytes one decode step of `searchrl_generate` moves at least: its matmuls' operands and outputs
    (`jaxpr_cost`: every weight, the live pages at the end of generation, the step's activations)."""
    pool, state, spec = _generation(cfg, batch, prompt_len, new_tokens, dtype=jax.tree.leaves(params)[0].dtype)
    traced = generate.decode_chunk.trace(cfg, params, pool, state, np.ones(batch, bool),
                                         (generate.stop_table(_NEVER),), _NO_EOS, spec)
    page_size = RolloutConfig.page_size
    per_step = pages_a_step(spec.compute.attention, page_size)
    trips = -(-(prompt_len + new_tokens) // (page_size * per_step))  # the blocks of pages live at the end
    return matmul_cost(traced.jaxpr, while_trips=1, trips={"paged_attention.reference": trips}).bytes


def bench_decode_scaling(preset: str, batch: int, live: int, slots: tuple[int, int], steps: int, rounds: int,
                         dtype: str) -> dict:
    """Part (s): ms per decode step of `batch` rows holding `live` tokens each, with `slots[0]` and with
    `slots[1]` slots reserved a row, in interleaved rounds. Paged, a step reads the live pages only, so the
    two should cost the same; a static cache walks every reserved slot."""
    cfg = dataclasses.replace(models.get_preset(preset), eos_token_id=None)
    params = models.unstack_layers(models.init_params(cfg, jax.random.key(0), jnp.dtype(dtype)))
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, live)).astype(np.int32)
    stops, allowed = (generate.stop_table(_NEVER),), np.ones(batch, bool)
    runs = {}
    for n in slots:
        pool, state, spec = _prefilled(cfg, params, prompts, steps, n)
        spec = dataclasses.replace(spec, max_turn_tokens=n)  # rows stay active: the next call decodes again
        runs[n] = [pool, state, spec]

    def decode(n: int) -> None:  # `steps` steps, then back to `live` tokens (in place: no copy)
        pool, state, spec = runs[n]
        pool, state = generate.decode_chunk(cfg, params, pool, state, allowed, stops, _NO_EOS, spec)
        runs[n][:2] = pool, jax.block_until_ready(generate.truncate(state, np.full(batch, live, np.int32)))

    timed = compare(lambda: decode(slots[1]), lambda: decode(slots[0]), rounds, calls=3, warmup=1)
    return {"decode_scaling_preset": preset, "decode_scaling_slots": list(slots), "decode_scaling_rows": batch, "decode_scaling_live": live,
            "decode_scaling_ms_per_step": [1e3 * statistics.median(t) / steps
                                           for t in (timed.peer_s, timed.ours_s)],
            # how many times the many-slot step costs the few-slot one, per round: median and range
            "decode_scaling_cost_ratio": 1 / statistics.median(timed.ratios),
            "decode_scaling_cost_ratio_range": [1 / max(timed.ratios), 1 / min(timed.ratios)]}


def bench_generate(preset: str, batch: int, prompt_len: int, new_tokens: int, rounds: int, dtype: str) -> dict:
    cfg = dataclasses.replace(models.get_preset(preset), eos_token_id=None)
    params = models.init_params(cfg, jax.random.key(0), jnp.dtype(dtype))
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, prompt_len)).astype(np.int32)
    with tempfile.TemporaryDirectory() as tmp:
        models.save_hf(cfg, params, tmp)  # the same weights on both sides
        torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=getattr(torch, dtype))
    params = models.unstack_layers(params)
    device = torch_device()
    torch_model = torch_model.to(device).eval()
    ids = torch.from_numpy(prompts).long().to(device)

    def run_torch():
        with torch.no_grad():
            out = torch_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        return out.cpu()

    ours = searchrl_generate(cfg, params, prompts, new_tokens)  # warm-up (compilation)
    theirs = run_torch()[:, prompt_len:].numpy()
    agree = float((ours == theirs).mean())
    timed = compare(lambda: searchrl_generate(cfg, params, prompts, new_tokens), run_torch, rounds,
                    warmup=0).summary("generate")
    tokens = batch * new_tokens
    # The share of the device's HBM bandwidth the decode steps use (prefill's time counted as decoding).
    chip = device_chip(jax.devices()[0].device_kind)
    step_bytes = decode_step_bytes(cfg, params, batch, prompt_len, new_tokens)
    bytes_per_s = step_bytes * new_tokens / timed["generate_searchrl_s"]
    return {**timed, "generate_searchrl_tokens_per_s": tokens / timed["generate_searchrl_s"],
            "generate_torch_tokens_per_s": tokens / timed["generate_peer_s"],
            "generate_greedy_token_agreement": agree, "decode_step_gb": step_bytes / 1e9,
            "decode_hbm_share": None if chip is None else bytes_per_s / chip.hbm_bandwidth}


@dataclasses.dataclass
class SearchEveryTurnEnv(Env):
    """The benchmark's multi-turn retrieval workload: each non-final turn's text is the query (a random policy
    writes no tags), its top `topk` passages the observation, the turn after `max_turns` the answer."""

    retriever: Any
    topk: int
    max_turns: int
    stop_strings: tuple[str, ...] = (tags.close_tag(tags.SEARCH),)  # never written by a random policy
    side_branch = None

    def prompt(self, example: Mapping[str, Any]) -> str:
        return f"Question: {example['question']}\n"

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        if turn_index < self.max_turns:
            return Action(tags.SEARCH, turn_text)
        return Action(tags.ANSWER, turn_text, done=True)

    def observe(self, actions: Sequence[Action]) -> list[Observation]:
        hits = self.retriever.search([a.content for a in actions], self.topk)
        return [Observation(tags.block(tags.INFORMATION, " ".join(h.contents for h in row))) for row in hits]

    def rewards(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[list[float]]:
        return [[0.0] * len(turns) for turns in trajectory.turns]

    def metrics(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [{"searches": searches(turns)} for turns in trajectory.turns]


def searches(turns: Sequence[Turn]) -> int:
    return sum(turn.action.kind == tags.SEARCH for turn in turns)


@dataclasses.dataclass
class SlowRetriever:
    """A retriever whose every `search` call first waits `latency_s`, as a call to a remote server does."""

    retriever: Any
    latency_s: float

    def search(self, queries: Sequence[str], k: int) -> list:
        time.sleep(self.latency_s)
        return self.retriever.search(queries, k)


# P(the episode ends after its t-th tool call | it made t), for 1..4 calls with probabilities 40/30/20/10%.
LONG_TAIL_STOP = (0.4, 0.3 / 0.6, 0.2 / 0.3, 1.0)


@dataclasses.dataclass
class LongTailEnv(SearchEveryTurnEnv):
    """Every episode searches with its first turn; after its t-th search, a turn answers (ending the episode)
    with probability `LONG_TAIL_STOP[t - 1]`, decided by a hash of the turn's text: 1 to 4 tool calls. With
    `intermediate_answers` (tokens), AutoSearch's intermediate answer after every search: a side branch
    that continues the trajectory with an answer prompt, greedy, as `tasks.autosearch` runs it."""

    max_turns: int = len(LONG_TAIL_STOP)
    intermediate_answers: int = 0

    @property
    def side_branch(self) -> SideBranch | None:
        if not self.intermediate_answers:
            return None
        return SideBranch("intermediate_answer", f" {tags.open_tag(tags.ANSWER)}", (tags.close_tag(tags.ANSWER),),
                          self.intermediate_answers, after_kinds=(tags.SEARCH,),
                          sampling=SamplingParams(temperature=0.0))

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        draw = zlib.crc32(turn_text.encode()) % 1000 / 1000
        if turn_index > 0 and draw < LONG_TAIL_STOP[turn_index - 1]:
            return Action(tags.ANSWER, turn_text, done=True)
        return Action(tags.SEARCH, turn_text)


def _long_tail_world(preset: str, episodes: int, passages: int, dtype: str):
    """The long-tail workload's model, tokenizer, BM25 index and questions."""
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        docs = synthetic_corpus(corpus, passages, seed=0)
        bm25 = BM25Retriever.build(corpus, Path(tmp) / "bm25", show_progress=False)
        tokenizer = train_bpe_tokenizer((" ".join(d) for d in docs[:5000]), vocab_size=4000)
    cfg = dataclasses.replace(models.get_preset(preset), vocab_size=len(tokenizer),
                              eos_token_id=tokenizer.eos_token_id)
    params = models.init_params(cfg, jax.random.key(0), jnp.dtype(dtype))
    return cfg, params, tokenizer, bm25, [{"question": q} for q in make_queries(docs, episodes, seed=1)]


def _long_tail_config(rows: int, extend_rows: int, parked_rows: int) -> RolloutConfig:
    turns = len(LONG_TAIL_STOP) + 1
    return RolloutConfig(max_prompt_tokens=64, max_len=64 + turns * (64 + 96), max_turn_tokens=64,
                         max_obs_tokens=96, obs_buckets=(96,), chunk_steps=2, decode_rows=rows,
                         extend_rows=extend_rows, parked_rows=parked_rows)


def _timed_engines(engines: dict[str, RolloutEngine], params, examples: list[dict], rounds: int, prefix: str
                   ) -> tuple[dict, dict[str, Trajectory]]:
    """Two engines' rollouts of `examples` in interleaved rounds, after one untimed rollout each (their
    stats count the timed ones): the comparison (first against second), each one's utilisation, idle share
    and episodes/s, and the compiles after warm-up; and each engine's trajectory."""
    (first, one), (second, other) = engines.items()
    one.warmup(params, len(examples))
    other.warmup(params, len(examples))
    compiled = generate.compiled_programs()
    key = jax.random.key(0)  # the same episodes every time, on both (scheduling does not change them)
    trajectories = {}
    for name, engine in engines.items():
        trajectories[name] = engine.run(params, examples, key)
        engine.stats = type(engine.stats)()
    timed = compare(lambda: one.run(params, examples, key), lambda: other.run(params, examples, key), rounds,
                    warmup=0).summary(prefix)
    out = {**timed, f"{prefix}_compiles_after_warmup": generate.compiled_programs() - compiled}
    for name, engine in engines.items():
        out |= {f"{prefix}_{name}_utilisation": engine.stats.utilisation,
                f"{prefix}_{name}_idle_share": engine.stats.idle_share,
                f"{prefix}_{name}_episodes_per_s": engine.stats.episodes_per_s}
    return out, trajectories


def bench_long_tail(preset: str, episodes: int, rows: int, extend_rows: int, parked_rows: int, passages: int,
                    latency_ms: float, rounds: int, dtype: str) -> dict:
    """Part (d): the lock-step and continuous schedules of one engine on the long-tail workload."""
    cfg, params, tokenizer, bm25, examples = _long_tail_world(preset, episodes, passages, dtype)
    env = LongTailEnv(SlowRetriever(bm25, latency_ms / 1000), topk=3)
    config = _long_tail_config(rows, extend_rows, parked_rows)
    engines = {schedule: RolloutEngine(cfg, tokenizer, env, dataclasses.replace(config, schedule=schedule),
                                       placement=_PLACEMENT)
               for schedule in ("continuous", "lockstep")}
    out, trajectories = _timed_engines(engines, params, examples, rounds, "long_tail")
    traj = trajectories["continuous"]  # the same episodes under either schedule
    mix = np.bincount([searches(t) for t in traj.turns], minlength=len(LONG_TAIL_STOP) + 1)[1:] / episodes
    return out | {"long_tail_calls_mix": [round(float(m), 3) for m in mix]}


def bench_intermediate_answers(preset: str, episodes: int, rows: int, extend_rows: int, parked_rows: int,
                               passages: int, latency_ms: float, rounds: int, dtype: str, tokens: int) -> dict:
    """Part (i): the continuous engine on the long-tail workload with AutoSearch's intermediate answers
    (`tokens` a branch, forked rows decoded beside the episodes) against the same workload without them."""
    cfg, params, tokenizer, bm25, examples = _long_tail_world(preset, episodes, passages, dtype)
    retriever = SlowRetriever(bm25, latency_ms / 1000)
    config = _long_tail_config(rows, extend_rows, parked_rows)
    engines = {name: RolloutEngine(cfg, tokenizer, LongTailEnv(retriever, topk=3, intermediate_answers=n),
                                   config, placement=_PLACEMENT)
               for name, n in (("answers", tokens), ("plain", 0))}
    out, trajectories = _timed_engines(engines, params, examples, rounds, "answers")
    traj = trajectories["answers"]
    answered = sum("intermediate_answer" in t.info for row in traj.turns for t in row)
    stats = engines["answers"].stats  # of the timed rollouts
    return out | {"answers_tokens": tokens, "answers_per_rollout": answered,
                  "answers_yields_per_rollout": stats.yields / rounds,
                  "answers_asides_per_rollout": stats.asides / rounds,
                  "answers_searches_per_rollout": sum(searches(t) for t in traj.turns)}


def build_retriever(kind: str, corpus: Path, work: Path, docs: list[list[str]], encoder: str | None
                    ) -> tuple[Any, str]:
    """(retriever, its description) over `corpus`: BM25, or dense with a FAISS Flat index on the GPU where
    FAISS has one (else on the CPU) and `encoder` (default: the packaged MiniLM, else a random encoder of
    its shape, `random_encoder`)."""
    if kind == "bm25":
        return BM25Retriever.build(corpus, work / "bm25", show_progress=False), "BM25"
    encoder = encoder or default_encoder() or random_encoder(work / "encoder", (" ".join(d) for d in docs))
    retriever = DenseRetriever.build(corpus, work / "dense", encoder, use_gpu=True, show_progress=False)
    return retriever, f"dense ({type(retriever.index).__name__}, encoder {encoder})"


def bench_search_rollout(preset: str, batch: int, passages: int, turns: int, rollouts: int, dtype: str,
                         retriever: str = "bm25", encoder: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        docs = synthetic_corpus(corpus, passages, seed=0)
        retriever, described = build_retriever(retriever, corpus, Path(tmp), docs, encoder)
        questions = make_queries(docs, batch * (rollouts + 1), seed=0)
        tokenizer = train_bpe_tokenizer((" ".join(d) for d in docs[:5000]), vocab_size=4000)
        cfg = dataclasses.replace(models.get_preset(preset), vocab_size=len(tokenizer),
                                  eos_token_id=tokenizer.eos_token_id)
        params = models.init_params(cfg, jax.random.key(0), jnp.dtype(dtype))
        env = SearchEveryTurnEnv(retriever, topk=3, max_turns=turns)
        config = RolloutConfig(max_prompt_tokens=64, max_len=64 + (turns + 1) * (48 + 160), max_turn_tokens=48,
                               max_obs_tokens=160, obs_buckets=(64, 160), chunk_steps=16)
        engine = RolloutEngine(cfg, tokenizer, env, config, placement=_PLACEMENT)
        batches = [[{"question": q} for q in questions[i * batch:(i + 1) * batch]] for i in range(rollouts + 1)]
        engine.warmup(params, batch)
        compiled = generate.compiled_programs()
        engine.run(params, batches[0], jax.random.key(0))
        engine.stats = type(engine.stats)()
        made = 0
        for i, examples in enumerate(batches[1:]):
            traj = engine.run(params, examples, jax.random.key(i + 1))
            made += sum(searches(turns) for turns in traj.turns)
    return {"retriever": described, "host_fraction": engine.stats.host_fraction,
            "rollout_wall_s": engine.stats.wall_s,
            "logprob_gap_max": logprob_gap(cfg, params, traj),
            "rollout_device_s": engine.stats.device_s, "searches": made,
            "compiles_after_warmup": generate.compiled_programs() - compiled, "compiled_programs": compiled}


def logprob_gap(cfg: models.ModelConfig, params, traj) -> float:
    """Largest |sampler log-prob - trainer recomputation| over the policy tokens of a trajectory."""
    tokens = jnp.asarray(traj.tokens)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    recomputed = models.token_logprobs(cfg, params, tokens, positions, jnp.asarray(traj.attention_mask),
                                       temperature=SamplingParams().temperature, compute=_PLACEMENT.train,
                                       remat=False, logits_chunk=0)
    policy = traj.loss_mask > 0
    return float(np.abs(np.asarray(recomputed)[policy] - traj.logprobs[policy]).max())


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    preset = flags.DEFINE_string("preset", "bench_small", "model preset (searchrl.models)",
                                 flag_values=values)
    batch = flags.DEFINE_integer("batch", 16, "prompts per generation / rollout", flag_values=values)
    prompt_len = flags.DEFINE_integer("prompt_len", 32, "prompt tokens (a)", flag_values=values)
    new_tokens = flags.DEFINE_integer("new_tokens", 128, "generated tokens per prompt (a)",
                                      flag_values=values)
    rounds = flags.DEFINE_integer("rounds", 5, "interleaved timed generations per side (a)",
                                  flag_values=values)
    passages = flags.DEFINE_integer("passages", 20_000, "passages in the corpus (b)", flag_values=values)
    retriever = flags.DEFINE_enum("retriever", "bm25", ("bm25", "dense"),
                                  "the search rollout's retriever (b)", flag_values=values)
    encoder = flags.DEFINE_string("encoder", None, "encoder dir for --retriever=dense (default: the packaged "
                                  "MiniLM, else a random one of its shape)", flag_values=values)
    turns = flags.DEFINE_integer("turns", 4, "search turns per rollout (b)", flag_values=values)
    rollouts = flags.DEFINE_integer("rollouts", 2, "timed rollouts, after one untimed (b)",
                                    flag_values=values)
    dtype = flags.DEFINE_enum("dtype", "float32", ("float32", "bfloat16"), "parameter and compute dtype",
                              flag_values=values)
    parts = flags.DEFINE_string("parts", "abd", "any of a: generation against transformers; b: search rollout "
                                "(with c); d: long tail; i: long tail with intermediate answers; s: decode "
                                "cost against reserved slots", flag_values=values)
    answer_tokens = flags.DEFINE_integer("answer_tokens", 32, "tokens an intermediate answer (i)",
                                         flag_values=values)
    scaling_preset = flags.DEFINE_string("scaling_preset", "tiny", "model preset of the decode scaling (s)",
                                         flag_values=values)
    scaling_live = flags.DEFINE_integer("scaling_live", 100, "live tokens a row (s)", flag_values=values)
    scaling_slots = flags.DEFINE_list("scaling_slots", ["512", "8192"], "the two slot counts a row (s)",
                                      flag_values=values)
    scaling_steps = flags.DEFINE_integer("scaling_steps", 16, "decode steps a timed call (s)", flag_values=values)
    episodes = flags.DEFINE_integer("episodes", 256, "episodes per long-tail rollout (d)", flag_values=values)
    decode_rows = flags.DEFINE_integer("decode_rows", 16, "decode rows of the long-tail engines (d)",
                                       flag_values=values)
    extend_rows = flags.DEFINE_integer("extend_rows", 1, "rows per append call of the long-tail engines (d)",
                                       flag_values=values)
    parked_rows = flags.DEFINE_integer("parked_rows", 16, "parked rows of the continuous engine (d)",
                                       flag_values=values)
    latency_ms = flags.DEFINE_float("latency_ms", 50.0, "waiting added to every search call (d)",
                                    flag_values=values)
    as_json = flags.DEFINE_boolean("json", False, "print one JSON object instead of a table",
                                   flag_values=values)

    cli.parse(values, argv, __doc__)
    if not parts.value or set(parts.value) - set("abdis"):
        raise SystemExit(f"--parts={parts.value!r}: give one or more of the letters a, b, d, i, s.")
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    r = {"preset": preset.value, "device": device_name(), "batch": batch.value,
         "dtype": dtype.value}
    if "a" in parts.value:
        r |= bench_generate(preset.value, batch.value, prompt_len.value, new_tokens.value, rounds.value,
                            dtype.value)
    if "b" in parts.value:
        r |= bench_search_rollout(preset.value, batch.value, passages.value, turns.value, rollouts.value,
                                  dtype.value, retriever.value, encoder.value)
    if "d" in parts.value:
        r |= bench_long_tail(preset.value, episodes.value, decode_rows.value, extend_rows.value,
                             parked_rows.value, passages.value, latency_ms.value, rounds.value, dtype.value)
    if "i" in parts.value:
        r |= bench_intermediate_answers(preset.value, episodes.value, decode_rows.value, extend_rows.value,
                                        parked_rows.value, passages.value, latency_ms.value, rounds.value,
                                        dtype.value, answer_tokens.value)
    if "s" in parts.value:
        slots = tuple(int(n) for n in scaling_slots.value)
        if len(slots) != 2:
            raise SystemExit(f"--scaling_slots={scaling_slots.value}: give two slot counts.")
        r |= bench_decode_scaling(scaling_preset.value, batch.value, scaling_live.value, slots,
                                  scaling_steps.value, rounds.value, dtype.value)
    if as_json.value:
        print(json.dumps(r))
        return
    if "a" in parts.value:
        _print_generate(r, prompt_len.value, new_tokens.value)
    if "b" in parts.value:
        _print_search_rollout(r, passages.value, turns.value)
    for part, line in rollout_report.PARTS.items():  # as docs/benchmarks.md words them
        if part in parts.value:
            print(line(r))


def _print_generate(r: dict, prompt_len: int, new_tokens: int) -> None:
    print(f"(a) greedy generation, {r['preset']}, batch {r['batch']}, prompt {prompt_len}, "
          f"{new_tokens} new tokens, {r['dtype']}, {r['device']}")
    print(f"    {'searchrl (jitted chunks)':<28}{r['generate_searchrl_tokens_per_s']:>10.0f} tokens/s")
    print(f"    {'transformers generate':<28}{r['generate_torch_tokens_per_s']:>10.0f} tokens/s")
    print(f"    {describe(r, 'generate')}")
    print(f"    greedy tokens identical: {r['generate_greedy_token_agreement']:.1%}")
    share = ("n/a (no bandwidth figure for this device)" if r["decode_hbm_share"] is None
             else f"{r['decode_hbm_share']:.1%}")
    print(f"    a decode step's matmuls move {r['decode_step_gb']:.3f} GB; share of HBM bandwidth: {share}")


def _print_search_rollout(r: dict, passages: int, turns: int) -> None:
    print(f"(b) {turns}-turn search rollout, {r['retriever']} over {passages} passages, batch {r['batch']}, "
          f"{r['searches']} searches")
    print(f"    wall {r['rollout_wall_s']:.2f}s, jitted {r['rollout_device_s']:.2f}s, "
          f"host fraction {r['host_fraction']:.1%}, sampler vs trainer log-prob gap {r['logprob_gap_max']:.2e}")
    print(f"(c) compiled programs {r['compiled_programs']}, after warm-up {r['compiles_after_warmup']}")



if __name__ == "__main__":
    cli.run(main)
