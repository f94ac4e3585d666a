"""The host side of a rollout: turns of jitted generation, with the environment's tool calls in between.

Per turn: decode chunks until every generating row stops -> re-check stops on text and trim -> the env parses each
row's action -> every row waiting on a tool is served in ONE batched `env.observe` call -> observations are
tokenised, truncated and appended to the cache with `extend`, which also starts the next turn.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from searchrl import models
from searchrl.envs.base import Action, Env, Observation
from searchrl.rollout import generate
from searchrl.rollout.sampling import SamplingParams
from searchrl.rollout.trajectory import Trajectory, Turn


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Static budgets of a rollout (they fix every compiled shape)."""

    max_prompt_tokens: int = 256
    max_len: int = 1024  # total slots a row may use: prompt + turns + observations
    max_turn_tokens: int = 128  # sampled tokens per policy turn
    max_obs_tokens: int = 256  # tokens per observation, after truncation
    obs_buckets: tuple[int, ...] = (32, 64, 128, 256)  # observation chunks are right-padded to one of these
    chunk_steps: int = 32  # decode steps per jitted chunk
    intermediate_answer_tokens: int = 32  # budget of one intermediate answer
    sampling: SamplingParams = SamplingParams()

    def __post_init__(self):
        if max(self.obs_buckets) < self.max_obs_tokens:
            raise ValueError(f"obs_buckets {self.obs_buckets} must cover max_obs_tokens={self.max_obs_tokens}.")


@dataclasses.dataclass
class RolloutStats:
    """Where a rollout's wall time went: jitted device work (waited for) versus everything on the host."""

    wall_s: float = 0.0
    device_s: float = 0.0

    @property
    def host_fraction(self) -> float:
        return 1.0 - self.device_s / self.wall_s if self.wall_s else 0.0


def pad_batch(sequences: Sequence[Sequence[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads token lists into int32 [B, width]; returns (tokens, lengths)."""
    tokens = np.zeros((len(sequences), width), np.int32)
    lengths = np.zeros((len(sequences),), np.int32)
    for b, seq in enumerate(sequences):
        tokens[b, : len(seq)] = seq
        lengths[b] = len(seq)
    return tokens, lengths


def first_stop_end(text: str, stop_strings: Sequence[str]) -> int | None:
    """End index of the earliest stop string in `text`, or None."""
    ends = [i + len(s) for s in stop_strings if (i := text.find(s)) >= 0]
    return min(ends) if ends else None


class RolloutEngine:
    """Runs batches of multi-turn episodes of one environment with one model."""

    def __init__(self, cfg: models.ModelConfig, tokenizer: Any, env: Env, config: RolloutConfig):
        self.cfg, self.tokenizer, self.env, self.config = cfg, tokenizer, env, config
        self.eos_set = _eos_ids(tokenizer, cfg)
        self.eos_ids = jnp.asarray(sorted(self.eos_set), jnp.int32)
        self.stops = generate.stop_table([self._encode(s) for s in env.stop_strings])
        self.answer_stops = generate.stop_table([self._encode("</answer>")])
        # Chunk widths: observation buckets, plus one that fits an observation followed by the answer prompt.
        self.chunk_widths = tuple(sorted(config.obs_buckets)) + (max(config.obs_buckets) + _ANSWER_PROMPT_ROOM,)
        self.slots = config.max_len + max(self.chunk_widths[-1], config.max_prompt_tokens)
        self.spec = generate.DecodeSpec(config.chunk_steps, config.max_turn_tokens, config.max_len, config.sampling)
        greedy = SamplingParams(temperature=0.0)
        self.answer_spec = generate.DecodeSpec(
            config.chunk_steps, config.intermediate_answer_tokens, self.slots - 1, greedy
        )
        self.stats = RolloutStats()

    def warmup(self, params, batch: int) -> None:
        """Compiles every program a rollout of `batch` rows can use, so that none compiles afterwards."""
        dtype = jax.tree.leaves(params)[0].dtype
        state = generate.init_state(self.cfg, batch, self.slots, jax.random.key(0), dtype)
        idle = np.zeros(batch, bool)
        specs = [(self.spec, self.stops)]
        if self.env.intermediate_answer_prompt() is not None:
            specs.append((self.answer_spec, self.answer_stops))
            state = generate.copy_state(state)
        for spec, stops in specs:
            widths = self.chunk_widths + ((self.config.max_prompt_tokens,) if spec is self.spec else ())
            for width in widths:
                tokens, lengths = pad_batch([[]] * batch, width)
                state = generate.extend(self.cfg, params, state, tokens, lengths, idle, spec.sampling)
            state = generate.decode_chunk(self.cfg, params, state, stops, self.eos_ids, spec)
        jax.block_until_ready(generate.truncate(state, jnp.zeros(batch, jnp.int32)))

    def _device(self, fn: Callable, *args) -> Any:
        """Runs a jitted call to completion, counting its time as device time."""
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        self.stats.device_s += time.perf_counter() - start
        return out

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i not in self.eos_set])

    def _bucket(self, n: int) -> int:
        for width in self.chunk_widths:
            if width >= n:
                return width
        raise ValueError(f"A chunk of {n} tokens exceeds the largest chunk width {self.chunk_widths[-1]}.")

    def _prefill(self, params, examples: Sequence[dict], key: jax.Array) -> generate.GenState:
        prompts = [self._encode(self.env.prompt(ex)) for ex in examples]
        for b, ids in enumerate(prompts):
            if len(ids) > self.config.max_prompt_tokens:
                raise ValueError(
                    f"Example {b}: prompt has {len(ids)} tokens > max_prompt_tokens={self.config.max_prompt_tokens}."
                )
        tokens, lengths = pad_batch(prompts, self.config.max_prompt_tokens)
        dtype = jax.tree.leaves(params)[0].dtype
        state = generate.init_state(self.cfg, len(examples), self.slots, key, dtype)
        start = np.ones(len(examples), bool)
        return self._device(generate.extend, self.cfg, params, state, tokens, lengths, start, self.config.sampling)

    def _finish_turn(self, tokens: np.ndarray, start: int, end: int) -> tuple[int, str]:
        """Re-checks stop strings on the turn's text: returns the end slot and the text, cut after the first stop.

        Token-id matching misses a stop the model spelled with other tokens; here the turn is trimmed after the
        first token whose text completes the stop.
        """
        text = self._decode(tokens[start:end])
        stop = first_stop_end(text, self.env.stop_strings)
        if stop is None or stop == len(text):
            return end, text
        lo, hi = start + 1, end  # smallest end whose text already contains the stop string
        while lo < hi:
            mid = (lo + hi) // 2
            if first_stop_end(self._decode(tokens[start:mid]), self.env.stop_strings) is None:
                lo = mid + 1
            else:
                hi = mid
        return lo, text[:stop]

    def _observation_tokens(self, obs: Observation, room: int) -> list[int]:
        """Tokenises an observation, truncating its body to `max_obs_tokens` and to the room left in the row."""
        limit = min(self.config.max_obs_tokens, room)
        ids = self._encode(obs.text)
        if len(ids) <= limit:
            return ids
        closing = self._encode(_closing_suffix(obs.text))
        return ids[: max(limit - len(closing), 0)] + closing[:limit]

    def _intermediate_answers(
        self, params, state: generate.GenState, rows: list[int], chunks: dict[int, list[int]]
    ) -> dict[int, str]:
        """Greedy answers of `rows` from their trajectory so far plus the observation and the answer prompt.

        Runs on a copy of the state, batched over rows; the main state is untouched.
        """
        prompt = self._encode(self.env.intermediate_answer_prompt())
        if len(prompt) > _ANSWER_PROMPT_ROOM:
            raise ValueError(f"The intermediate answer prompt has {len(prompt)} tokens > {_ANSWER_PROMPT_ROOM}.")
        branch = self._device(generate.copy_state, state)
        sequences = [chunks[b] + prompt if b in chunks else [] for b in range(state.tokens.shape[0])]
        width = self._bucket(max(len(s) for s in sequences))
        tokens, lengths = pad_batch(sequences, width)
        start = np.isin(np.arange(len(sequences)), rows)
        branch = self._device(
            generate.extend, self.cfg, params, branch, tokens, lengths, start, self.answer_spec.sampling
        )
        while bool(jax.device_get(branch.active).any()):
            branch = self._device(
                generate.decode_chunk, self.cfg, params, branch, self.answer_stops, self.eos_ids, self.answer_spec
            )
        out_tokens, turn_start, length = jax.device_get((branch.tokens, branch.turn_start, branch.cache.length))
        answers = {}
        for b in rows:
            text = self._decode(out_tokens[b, turn_start[b] : length[b]])
            answers[b] = text.split("</answer>")[0].strip()
        return answers

    def run(self, params, examples: Sequence[dict], key: jax.Array) -> Trajectory:
        """Rolls out one episode per example; returns the finished batch. Adds its timings to `self.stats`."""
        start = time.perf_counter()
        trajectory = self._run(params, examples, key)
        self.stats.wall_s += time.perf_counter() - start
        return trajectory

    def _run(self, params, examples: Sequence[dict], key: jax.Array) -> Trajectory:
        batch = len(examples)
        state = self._prefill(params, examples, key)
        prompt_lengths = np.asarray(jax.device_get(state.cache.length))
        turns: list[list[Turn]] = [[] for _ in range(batch)]
        finish: list[str | None] = [None] * batch
        intermediate: list[list[str]] = [[] for _ in range(batch)]
        generating = list(range(batch))
        for turn_index in range(self.env.max_turns + 1):
            while bool(jax.device_get(state.active).any()):
                state = self._device(
                    generate.decode_chunk, self.cfg, params, state, self.stops, self.eos_ids, self.spec
                )
            tokens, turn_start, length = jax.device_get((state.tokens, state.turn_start, state.cache.length))
            length = np.array(length)
            tools_allowed = turn_index < self.env.max_turns
            waiting: list[int] = []
            for b in generating:
                end, text = self._finish_turn(tokens[b], int(turn_start[b]), int(length[b]))
                length[b] = end
                action = self.env.parse_action(text, tools_allowed)
                turns[b].append(Turn(int(turn_start[b]), end, text, action))
                if action.ends_episode:
                    finish[b] = "answer"
                elif not tools_allowed:
                    finish[b] = "max_turns"
                elif self.config.max_len - end < 2:  # no room for an observation and a new turn
                    finish[b] = "length"
                else:
                    waiting.append(b)
            state = self._device(generate.truncate, state, jnp.asarray(length))
            if not waiting:
                break
            observations = self.env.observe([turns[b][-1].action for b in waiting])
            chunks = {}
            for b, obs in zip(waiting, observations):
                if not obs.text:
                    raise ValueError(f"Row {b}: the environment returned an empty observation.")
                chunks[b] = self._observation_tokens(obs, self.config.max_len - int(length[b]) - 1)
                turns[b][-1].observation = self._decode(chunks[b])
                turns[b][-1].doc_ids = obs.doc_ids
            searched = [b for b in waiting if turns[b][-1].action.kind == "search"]
            if searched and self.env.intermediate_answer_prompt() is not None:
                for b, answer in self._intermediate_answers(params, state, searched, chunks).items():
                    intermediate[b].append(answer)
            sequences = [chunks.get(b, []) for b in range(batch)]
            chunk, chunk_len = pad_batch(sequences, self._bucket(max(len(s) for s in sequences)))
            start = np.isin(np.arange(batch), waiting)
            state = self._device(
                generate.extend, self.cfg, params, state, chunk, chunk_len, start, self.config.sampling
            )
            generating = waiting
        return self._trajectory(state, prompt_lengths, turns, finish, intermediate)

    def _trajectory(self, state, prompt_lengths, turns, finish, intermediate) -> Trajectory:
        tokens, policy, logprobs, length = jax.device_get(
            (state.tokens, state.policy, state.logprobs, state.cache.length)
        )
        slots = np.arange(tokens.shape[1])[None, :]
        attention = slots < np.asarray(length)[:, None]
        return Trajectory(
            tokens=np.where(attention, tokens, 0).astype(np.int32),
            attention_mask=attention,
            loss_mask=(np.asarray(policy) & attention).astype(np.float32),
            logprobs=np.where(attention, logprobs, 0.0).astype(np.float32),
            prompt_lengths=np.asarray(prompt_lengths, np.int32),
            lengths=np.asarray(length, np.int32),
            turns=turns,
            finish_reasons=[f or "max_turns" for f in finish],
            intermediate_answers=intermediate,
            logprob_temperature=self.config.sampling.logprob_temperature,
        )


_CLOSING_TAG = re.compile(r"</[A-Za-z_]+>\s*\Z")
_ANSWER_PROMPT_ROOM = 64  # tokens reserved for the intermediate answer prompt


def _eos_ids(tokenizer: Any, cfg: models.ModelConfig) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    eos = getattr(cfg, "eos_token_id", None)
    ids |= set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())
    if not ids:
        raise ValueError("Neither the tokenizer nor the model config names an EOS token.")
    return ids


def _closing_suffix(text: str) -> str:
    """The part of an observation kept through truncation: a closing tag that ends it, with trailing whitespace."""
    match = _CLOSING_TAG.search(text)
    return match.group(0) if match else ""
