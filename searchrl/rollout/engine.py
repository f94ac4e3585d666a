"""The host side of a rollout: turns of jitted generation, with the environment's tool calls in between.

Per turn: decode chunks until every generating row stops -> re-check stops on text and trim -> the env parses each
row's action (and says whether it ends the episode) -> every row waiting on the env is served in ONE batched
`env.observe` call -> observations are tokenised, truncated and appended to the cache with `extend`, which
also starts the next turn. The engine knows no task: a row ends when the env says so or when its slots run
out, and an env's side branch (`episode.SideBranch`) runs on a copy of the state after the turns it names (or
on an emptied copy, from its own prompt).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchrl import models
from searchrl.episode import Env, Observation, SideBranch, Trajectory, Turn
from searchrl.rollout import generate
from searchrl.rollout.config import RolloutConfig, SamplingParams
from searchrl.text import chat


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
    """Runs batches of multi-turn episodes of one environment with one model.

    `side_branch=False` skips the env's side branch (the trajectories are the same; the turns lack its
    output). With a `mesh`, the rollout is sharded: rows data-parallel over its data and fsdp axes, heads
    and the MLP over its tensor axis (`rules`: `MeshConfig.sample_rules`; attention computed by `attention`:
    `MeshConfig.attention`), the KV cache created in
    that layout, and the params moved into it once per rollout, device to device (`sampling_params`). A mesh
    over several processes is the training mesh: each process rolls out its own rows on its block of it
    (`models.process_mesh`). Host arrays reach the device only through explicit transfers. With a `dtype`
    (the trainer's compute dtype), the rollout samples with the params cast to it, as the trainer scores
    them, and keeps its KV cache in it.
    """

    def __init__(self, cfg: models.ModelConfig, tokenizer: Any, env: Env, config: RolloutConfig,
                 side_branch: bool = True, mesh: Mesh | None = None, dtype: str | None = None, *,
                 rules: models.ShardingRules, attention: models.AttentionConfig):
        self.cfg, self.tokenizer, self.env, self.config = cfg, tokenizer, env, config
        self.train_mesh, self.mesh = mesh, mesh if mesh is None else models.process_mesh(mesh)
        self.dtype, self.rules, self.attention = dtype, rules, attention
        self.eos_set = _eos_ids(tokenizer, cfg)
        self.eos_ids = self._replicated(jnp.asarray(sorted(self.eos_set), jnp.int32))
        self.stops = self._replicated(generate.stop_table([self._encode(s) for s in env.stop_strings]))
        self.spec = generate.DecodeSpec(config.chunk_steps, config.max_turn_tokens, config.max_len,
                                        config.sampling, rules=rules, attention=attention)
        self.chunk_widths = tuple(sorted(config.obs_buckets))
        declared = env.side_branch
        if declared is not None and not declared.separate_prompt:  # one more width: observation + its prompt
            self.branch_prompt = self._encode(declared.prompt)
            if len(self.branch_prompt) > _BRANCH_PROMPT_ROOM:
                raise ValueError(f"Side branch {declared.name!r}: its prompt has {len(self.branch_prompt)} "
                                 f"tokens > {_BRANCH_PROMPT_ROOM}.")
            self.chunk_widths += (self.chunk_widths[-1] + _BRANCH_PROMPT_ROOM,)
        # The shapes depend on the declared branch only, so a run without it is the same computation.
        self.slots = config.slots(self.chunk_widths[-1])
        self.branch: SideBranch | None = declared if side_branch else None
        if self.branch is not None:
            self.branch_spec = generate.DecodeSpec(config.chunk_steps, self.branch.max_tokens, self.slots - 1,
                                                   self.branch.sampling, rules=rules, attention=attention)
            self.branch_stops = self._replicated(
                generate.stop_table([self._encode(s) for s in self.branch.stop_strings]))
        self.stats = RolloutStats()
        self._warmup_key = jax.random.key(0)  # made here: a key from a Python int is a host transfer

    def sampling_params(self, params):
        """The policy's params as the rollout samples with them: cast to the engine's `dtype`, and on its mesh
        in the sampling layout (`rules`), both on device (e.g. from the trainer's float32 FSDP layout,
        never through the host). Across processes, every process gets a whole copy on its own devices."""
        if self.dtype is not None and jax.tree.leaves(params)[0].dtype != jnp.dtype(self.dtype):
            params = _cast(params, self.dtype)
        if self.mesh is None:
            return params
        params = jax.device_put(params, models.param_shardings(self.cfg, self.train_mesh, self.rules))
        return models.to_process_mesh(params, self.mesh)

    def _replicated(self, x: jax.Array | np.ndarray) -> jax.Array:
        """`x` put on every device of the mesh (on the default device without one), explicitly."""
        return jax.device_put(x, None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec()))

    def _to_device(self, x: np.ndarray) -> jax.Array:
        """A host array of per-row values put on device explicitly (never handed to a jitted call as is: an
        implicit transfer), its rows sharded over the mesh's data axes."""
        if self.mesh is None:
            return jax.device_put(x)
        return jax.device_put(x, models.rows_sharding(x.shape, self.mesh, self.rules))

    def _new_state(self, params, batch: int, key: jax.Array, first_row: int = 0) -> generate.GenState:
        dtype = jax.tree.leaves(params)[0].dtype
        return self._call(generate.new_state, self.cfg, batch, self.slots, self._replicated(key),
                          self._replicated(np.int32(first_row)), dtype, self.rules)

    def warmup(self, params, batch: int) -> None:
        """Compiles every program a rollout of `batch` rows can use, so that none compiles afterwards."""
        params = self.sampling_params(params)
        state = self._new_state(params, batch, self._warmup_key)
        idle = self._to_device(np.zeros(batch, bool))
        specs = [(self.spec, self.stops)]
        if self.branch is not None:
            specs.append((self.branch_spec, self.branch_stops))
            state = self._call(generate.branch_state, state)
        for spec, stops in specs:
            one_call_prefill = spec is self.spec and not self.config.chunked_prefill
            widths = self.chunk_widths + ((self.config.max_prompt_tokens,) if one_call_prefill else ())
            for width in widths:
                tokens, lengths = map(self._to_device, pad_batch([[]] * batch, width))
                state = self._call(generate.extend, self.cfg, params, state, tokens, lengths, idle,
                                   spec.sampling, self.rules, self.attention)
            state = self._call(generate.decode_chunk, self.cfg, params, state, stops, self.eos_ids, spec)
        self._call(generate.truncate, state, self._to_device(np.zeros(batch, np.int32)))

    def _call(self, fn: Callable, *args) -> Any:
        """Runs a jitted call to completion, under the engine's mesh."""
        with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
            return jax.block_until_ready(fn(*args))

    def _device(self, fn: Callable, *args) -> Any:
        """`_call`, counting its time as device time."""
        start = time.perf_counter()
        out = self._call(fn, *args)
        self.stats.device_s += time.perf_counter() - start
        return out

    def _decode_chunks(self, params, state: generate.GenState, stops: jax.Array, spec: generate.DecodeSpec
                       ) -> generate.GenState:
        """Decode chunks until every active row has stopped."""
        while bool(jax.device_get(state.active).any()):
            state = self._device(generate.decode_chunk, self.cfg, params, state, stops, self.eos_ids, spec)
        return state

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i not in self.eos_set])

    def _bucket(self, n: int) -> int:
        for width in self.chunk_widths:
            if width >= n:
                return width
        raise ValueError(f"A chunk of {n} tokens exceeds the largest chunk width {self.chunk_widths[-1]}.")

    def _prefill(self, params, examples: Sequence[dict], key: jax.Array, first_row: int) -> generate.GenState:
        prompts = [self._encode(chat.render(self.tokenizer, self.env.prompt(ex))) for ex in examples]
        for b, ids in enumerate(prompts):
            if len(ids) > self.config.max_prompt_tokens:
                raise ValueError(
                    f"Example {b}: prompt has {len(ids)} tokens > max_prompt_tokens={self.config.max_prompt_tokens}."
                )
        state = self._new_state(params, len(examples), key, first_row)
        start = np.ones(len(examples), bool)
        if self.config.chunked_prefill:
            return self._extend_in_chunks(params, state, prompts, start, self.config.sampling)
        tokens, lengths = map(self._to_device, pad_batch(prompts, self.config.max_prompt_tokens))
        return self._device(generate.extend, self.cfg, params, state, tokens, lengths, self._to_device(start),
                            self.config.sampling, self.rules, self.attention)

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

    def observation_text(self, obs: Observation, used: int) -> str:
        """The observation's text as a rollout gives it to a row that has used `used` slots: truncated to
        `max_obs_tokens` and to the room left."""
        return self._decode(self._observation_tokens(obs, self.config.max_len - used - 1))

    def _extend_in_chunks(self, params, state: generate.GenState, sequences: list[list[int]],
                          start: np.ndarray, sampling: SamplingParams) -> generate.GenState:
        """Appends each row's tokens in chunks of at most the widest chunk width, aligned so that every row's
        last chunk comes in the last call, which starts the turn of the `start` rows."""
        width = self.chunk_widths[-1]
        calls = max(-(-len(s) // width) for s in sequences)
        for left in range(calls, 0, -1):  # `left` chunks to go, counted from each row's end
            pieces = [s[max(len(s) - left * width, 0):max(len(s) - (left - 1) * width, 0)] for s in sequences]
            tokens, lengths = map(self._to_device, pad_batch(pieces, self._bucket(max(len(p) for p in pieces))))
            starting = self._to_device(start if left == 1 else np.zeros_like(start))
            state = self._device(generate.extend, self.cfg, params, state, tokens, lengths, starting,
                                 sampling, self.rules, self.attention)
        return state

    def _side_branch(self, params, state: generate.GenState, rows: list[int], chunks: dict[int, list[int]],
                     examples: Sequence[dict], turns: list[list[Turn]]) -> dict[int, str]:
        """The side branch's text for `rows`, sampled after their observation chunk and the branch's prompt,
        or after the env's separate branch prompt alone.

        Runs on a copy of the state (emptied for a separate prompt), batched over rows; the main state is
        untouched.
        """
        branch = self._device(generate.branch_state, state)
        batch = state.tokens.shape[0]
        if self.branch.separate_prompt:
            branch = self._device(generate.truncate, branch, self._to_device(np.zeros(batch, np.int32)))
            prompts = {b: self.env.side_branch_prompt(examples[b], turns[b]) for b in rows}
            sequences = [self._encode(chat.render(self.tokenizer, prompts[b])) if b in rows else []
                         for b in range(batch)]
            room = self.slots - 1 - self.branch.max_tokens
            if (longest := max(len(s) for s in sequences)) > room:
                raise ValueError(f"Side branch {self.branch.name!r}: a prompt has {longest} tokens, more "
                                 f"than the {room} a row has room for before its {self.branch.max_tokens} "
                                 "(raise rollout.max_prompt_tokens: it adds slots to every row).")
        else:
            sequences = [chunks[b] + self.branch_prompt if b in rows else [] for b in range(batch)]
        start = np.isin(np.arange(batch), rows)
        branch = self._extend_in_chunks(params, branch, sequences, start, self.branch_spec.sampling)
        branch = self._decode_chunks(params, branch, self.branch_stops, self.branch_spec)
        out_tokens, turn_start, length = jax.device_get((branch.tokens, branch.turn_start, branch.cache.length))
        texts = {}
        for b in rows:
            text = self._decode(out_tokens[b, turn_start[b] : length[b]])
            stop = first_stop_end(text, self.branch.stop_strings)
            texts[b] = text if stop is None else text[:stop]
        return texts

    def run(self, params, examples: Sequence[dict], key: jax.Array, first_row: int = 0) -> Trajectory:
        """Rolls out one episode per example; returns the finished batch. Adds its timings to `self.stats`.

        The examples are rows `first_row` .. of a global batch (a process's share): each row samples with its
        global index (`generate.init_state`), so the tokens do not depend on how the batch is split."""
        start = time.perf_counter()
        trajectory = self._run(params, examples, key, first_row)
        self.stats.wall_s += time.perf_counter() - start
        return trajectory

    def _run(self, params, examples: Sequence[dict], key: jax.Array, first_row: int) -> Trajectory:
        batch = len(examples)
        params = self.sampling_params(params)
        state = self._prefill(params, examples, key, first_row)
        prompt_lengths = np.asarray(jax.device_get(state.cache.length))
        turns: list[list[Turn]] = [[] for _ in range(batch)]
        finish = ["length"] * batch
        generating = list(range(batch))
        turn_index = 0
        while generating:
            state = self._decode_chunks(params, state, self.stops, self.spec)
            tokens, turn_start, length = jax.device_get((state.tokens, state.turn_start, state.cache.length))
            length = np.array(length)
            waiting: list[int] = []
            for b in generating:
                end, text = self._finish_turn(tokens[b], int(turn_start[b]), int(length[b]))
                length[b] = end
                action = self.env.parse_action(text, turn_index)
                turns[b].append(Turn(int(turn_start[b]), end, text, action))
                if action.done:
                    finish[b] = "done"
                elif self.config.max_len - end >= 2:  # room for an observation and a new turn
                    waiting.append(b)
            state = self._device(generate.truncate, state, self._to_device(length))
            if not waiting:
                break
            observations = self.env.observe([turns[b][-1].action for b in waiting])
            if len(observations) != len(waiting):
                raise ValueError(f"The environment returned {len(observations)} observations for "
                                 f"{len(waiting)} actions.")
            chunks = {}
            for b, obs in zip(waiting, observations):
                if not obs.text:
                    raise ValueError(f"Row {b}: the environment returned an empty observation.")
                chunks[b] = self._observation_tokens(obs, self.config.max_len - int(length[b]) - 1)
                turns[b][-1].observation = self._decode(chunks[b])
                turns[b][-1].info.update(obs.info)
            if self.branch is not None:
                rows = [b for b in waiting if turns[b][-1].action.kind in self.branch.after_kinds]
                texts = self._side_branch(params, state, rows, chunks, examples, turns) if rows else {}
                for b, text in texts.items():
                    turns[b][-1].info[self.branch.name] = text
            sequences = [chunks.get(b, []) for b in range(batch)]
            chunk, chunk_len = map(self._to_device, pad_batch(sequences, self._bucket(max(len(s) for s in sequences))))
            start = self._to_device(np.isin(np.arange(batch), waiting))
            state = self._device(
                generate.extend, self.cfg, params, state, chunk, chunk_len, start, self.config.sampling,
                self.rules, self.attention)
            generating = waiting
            turn_index += 1
        return self._trajectory(state, prompt_lengths, turns, finish)

    def _trajectory(self, state, prompt_lengths, turns, finish) -> Trajectory:
        tokens, sampled, logprobs, length = jax.device_get(
            (state.tokens, state.sampled, state.logprobs, state.cache.length)
        )
        slots = np.arange(tokens.shape[1])[None, :]
        attention = slots < np.asarray(length)[:, None]
        return Trajectory(
            tokens=np.where(attention, tokens, 0).astype(np.int32),
            attention_mask=attention,
            loss_mask=(np.asarray(sampled) & attention).astype(np.float32),
            logprobs=np.where(attention, logprobs, 0.0).astype(np.float32),
            prompt_lengths=np.asarray(prompt_lengths, np.int32),
            lengths=np.asarray(length, np.int32),
            turns=turns,
            finish_reasons=finish,
            logprob_temperature=self.config.sampling.logprob_temperature,
            side_branch=None if self.branch is None else self.branch.name,
        )


_CLOSING_TAG = re.compile(r"</[A-Za-z_]+>\s*\Z")
_BRANCH_PROMPT_ROOM = 64  # tokens reserved for a side branch's prompt


@functools.partial(jax.jit, static_argnames=("dtype",))
def _cast(params, dtype: str):
    return jax.tree.map(lambda p: p.astype(dtype), params)


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
