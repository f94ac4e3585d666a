"""The host side of a rollout: continuous batching of episodes over a fixed set of decode rows, with the
environment's tool calls on host threads, overlapped with decoding.

A rollout of N episodes keeps `rollout.decode_rows` rows (the compiled batch) busy. Each round of the host
loop: append the observations the env returned (`extend`, one call per observation bucket in use, which
starts those rows' next turns) and prefill the next waiting prompts into free rows (`reset_rows`, then
`extend`) -> dispatch a decode chunk (asynchronous) -> while it runs, the rows that stopped in the last chunk
are re-checked for stops on text, trimmed, and handed to the env (`parse_action`, then one `observe` call)
on a worker thread -> read which rows the chunk stopped. A row ends when the env says so or when its slots
run out; its episode goes to the finished batch and the row is refilled. An env's side branch
(`episode.SideBranch`) runs on a copy of the state after the turns it names (or on an emptied copy, from
its own prompt). `rollout.schedule="lockstep"` runs the same loop with every row's turn awaited together:
the env gets the batch's actions in one call once every row stopped, observations are appended once all
returned, rows are refilled once all are free.

Scheduling never changes an episode: episode i samples with the key of global row `first_row + i` and each
token with that key folded with its slot (`generate.init_state`), and every jitted call's shape for a row
depends on the row's own data only. The engine knows no task.
"""
from __future__ import annotations

import collections
import concurrent.futures
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
from searchrl.episode import Action, Env, Observation, SideBranch, Trajectory, Turn
from searchrl.rollout import generate
from searchrl.rollout.config import RolloutConfig, SamplingParams
from searchrl.text import chat


@dataclasses.dataclass
class RolloutStats:
    """Where a rollout's wall time went and how much of the decode batch did useful work.

    `device_s`: time the host waited for jitted work; `idle_s`: time the device had nothing to do while the
    host worked or waited for the env (an upper bound: host work counts as idle when the decode chunk it
    overlapped had ended by its end); `decode_row_steps`: rows x decode steps run; `decode_tokens`: the
    tokens those steps wrote (the other row-steps were rows waiting, finished or idle).
    """

    wall_s: float = 0.0
    device_s: float = 0.0
    idle_s: float = 0.0
    episodes: int = 0
    decode_row_steps: int = 0
    decode_tokens: int = 0

    @property
    def host_fraction(self) -> float:
        return 1.0 - self.device_s / self.wall_s if self.wall_s else 0.0

    @property
    def idle_share(self) -> float:
        """The share of wall time the device idled waiting for the host (at most)."""
        return self.idle_s / self.wall_s if self.wall_s else 0.0

    @property
    def utilisation(self) -> float:
        """Decode slot utilisation: useful generated token-steps / decode row-steps."""
        return self.decode_tokens / self.decode_row_steps if self.decode_row_steps else 0.0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s if self.wall_s else 0.0


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

    def warmup(self, params, episodes: int) -> None:
        """Compiles every program a rollout of `episodes` episodes can use: none compiles afterwards."""
        params = self.sampling_params(params)
        batch = self.rows(episodes)
        key = self._replicated(self._warmup_key)
        state = self._new_state(params, batch, key)
        idle = self._to_device(np.zeros(batch, bool))
        state = self._call(generate.reset_rows, state, idle, key, self._to_device(np.zeros(batch, np.int32)),
                           self.rules)
        self._call(generate.progress, state)
        specs = [(self.spec, self.stops)]
        if self.branch is not None:
            specs.append((self.branch_spec, self.branch_stops))
            state = self._call(generate.branch_state, state, idle)
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
        """Decode chunks until every active row has stopped, waiting for each."""
        active, decoded = jax.device_get(self._call(generate.progress, state))
        while active.any():
            state = self._device(generate.decode_chunk, self.cfg, params, state, stops, self.eos_ids, spec)
            active, now = jax.device_get(self._call(generate.progress, state))
            self._count_steps(decoded, now)
            decoded = now
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

    def _side_branch(self, params, state: generate.GenState, run: _Run, rows: list[int],
                     chunks: dict[int, list[int]]) -> dict[int, str]:
        """The side branch's text for `rows`, sampled after their observation chunk and the branch's prompt,
        or after the env's separate branch prompt alone.

        Runs on a copy of the state (emptied for a separate prompt) in which only `rows` generate, batched
        over them; the main state is untouched.
        """
        batch = state.tokens.shape[0]
        branch = self._device(generate.branch_state, state, self._to_device(np.isin(np.arange(batch), rows)))
        if self.branch.separate_prompt:
            branch = self._device(generate.truncate, branch, self._to_device(np.zeros(batch, np.int32)))
            sequences = {r: self._encode(chat.render(self.tokenizer, self.env.side_branch_prompt(
                run.examples[run.rows[r].episode], run.rows[r].turns))) for r in rows}
            room = self.slots - 1 - self.branch.max_tokens
            if (longest := max(len(s) for s in sequences.values())) > room:
                raise ValueError(f"Side branch {self.branch.name!r}: a prompt has {longest} tokens, more "
                                 f"than the {room} a row has room for before its {self.branch.max_tokens} "
                                 "(raise rollout.max_prompt_tokens: it adds slots to every row).")
        else:
            sequences = {r: chunks[r] + self.branch_prompt for r in rows}
        branch = self._append(params, branch, sequences, set(rows), self.branch_spec.sampling)
        branch = self._decode_chunks(params, branch, self.branch_stops, self.branch_spec)
        out_tokens, turn_start, length = jax.device_get((branch.tokens, branch.turn_start, branch.cache.length))
        texts = {}
        for r in rows:
            text = self._decode(out_tokens[r, turn_start[r] : length[r]])
            stop = first_stop_end(text, self.branch.stop_strings)
            texts[r] = text if stop is None else text[:stop]
        return texts

    def run(self, params, examples: Sequence[dict], key: jax.Array, first_row: int = 0) -> Trajectory:
        """Rolls out one episode per example; returns them in order, one row each. Adds to `self.stats`.

        The examples are episodes `first_row` .. of a global batch (a process's share): each samples with its
        global index (`generate.reset_rows`), so its tokens depend neither on how the batch is split nor on
        the row or the schedule it runs in."""
        start = time.perf_counter()
        trajectory = self._run(params, examples, key, first_row)
        self.stats.wall_s += time.perf_counter() - start
        self.stats.episodes += len(examples)
        return trajectory

    def rows(self, episodes: int) -> int:
        """Decode rows of a rollout of `episodes` episodes (the batch its programs are compiled for)."""
        return self.config.decode_rows or episodes

    def _prompts(self, examples: Sequence[dict]) -> list[list[int]]:
        prompts = [self._encode(chat.render(self.tokenizer, self.env.prompt(ex))) for ex in examples]
        for b, ids in enumerate(prompts):
            if len(ids) > self.config.max_prompt_tokens:
                raise ValueError(f"Example {b}: prompt has {len(ids)} tokens > "
                                 f"max_prompt_tokens={self.config.max_prompt_tokens}.")
        return prompts

    def _run(self, params, examples: Sequence[dict], key: jax.Array, first_row: int) -> Trajectory:
        prompts = self._prompts(examples)
        params = self.sampling_params(params)
        run = _Run(examples, prompts, [None] * self.rows(len(examples)), first_row,
                   _Episodes.empty(len(examples), self.slots), self.config.schedule == "lockstep")
        state = self._new_state(params, len(run.rows), key, first_row)
        key = self._replicated(key)
        with concurrent.futures.ThreadPoolExecutor(self.config.env_workers) as pool:
            while run.waiting or any(row is not None for row in run.rows):
                state = self._step(params, state, key, run, pool)
        return run.episodes.trajectory(self.config.sampling.logprob_temperature,
                                       None if self.branch is None else self.branch.name)

    def _step(self, params, state: generate.GenState, key: jax.Array, run: _Run,
              pool: concurrent.futures.Executor) -> generate.GenState:
        """One round of the host loop: append the observations that came back and refill free rows, dispatch
        a decode chunk of the generating rows, send the rows that stopped to the env while it runs, then
        read which rows the chunk stopped. With nothing to decode, wait for the env (the device idles)."""
        clock = time.perf_counter()
        if run.futures and not (run.lockstep and (run.rows_in("decode") or run.rows_in("stopped"))):
            state = self._take_observations(params, state, run)
        free = [r for r, row in enumerate(run.rows) if row is None]
        if run.waiting and free and not (run.lockstep and len(free) < len(run.rows)):
            state = self._refill(params, state, key, run, free)
        decoding, probe = run.rows_in("decode"), None
        if decoding:
            state = self._dispatch(generate.decode_chunk, self.cfg, params, state, self.stops, self.eos_ids,
                                   self.spec)
            probe = self._dispatch(generate.progress, state)
        dispatched = time.perf_counter()
        stopped = run.rows_in("stopped")
        if stopped and not (run.lockstep and decoding):
            state = self._send_to_env(state, run, stopped, pool)
        overlapped = probe is not None and not probe[0].is_ready()
        # Host work counts as idle device time unless a chunk still ran at its end (so: at most).
        self.stats.idle_s += (dispatched if overlapped else time.perf_counter()) - clock
        if probe is not None:
            self._read_stops(state, run, decoding, probe)
        elif run.futures:
            self._wait_for_env(run)
        return state

    def _dispatch(self, fn: Callable, *args) -> Any:
        """Starts a jitted call under the engine's mesh without waiting for it (dispatch is asynchronous)."""
        with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
            return fn(*args)

    def _read_stops(self, state: generate.GenState, run: _Run, decoding: list[int], probe) -> None:
        """Waits for the chunk, counts its useful row-steps, and snapshots the rows it stopped."""
        start = time.perf_counter()
        active, decoded = jax.device_get(probe)
        self.stats.device_s += time.perf_counter() - start
        self._count_steps(run.decoded, decoded)
        run.decoded = decoded
        stopped = [r for r in decoding if not active[r]]
        if not stopped:
            return
        start = time.perf_counter()
        tokens, sampled, logprobs, turn_start, length = jax.device_get(
            (state.tokens, state.sampled, state.logprobs, state.turn_start, state.cache.length))
        self.stats.device_s += time.perf_counter() - start
        for r in stopped:
            row = run.rows[r]
            row.phase, row.turn_start, row.length = "stopped", int(turn_start[r]), int(length[r])
            row.snapshot = (tokens[r], sampled[r], logprobs[r])

    def _count_steps(self, before: np.ndarray, after: np.ndarray) -> None:
        """Adds one chunk's decode row-steps (rows x steps: the longest row's advance) and useful ones."""
        advance = np.asarray(after) - np.asarray(before)
        self.stats.decode_tokens += int(advance.sum())
        self.stats.decode_row_steps += int(advance.max(initial=0)) * len(advance)

    def _wait_for_env(self, run: _Run) -> None:
        """Blocks until the env answers (every call under lock step): the device has nothing to do."""
        start = time.perf_counter()
        when = concurrent.futures.ALL_COMPLETED if run.lockstep else concurrent.futures.FIRST_COMPLETED
        concurrent.futures.wait(run.futures, return_when=when)
        self.stats.idle_s += time.perf_counter() - start

    def _send_to_env(self, state: generate.GenState, run: _Run, stopped: list[int],
                     pool: concurrent.futures.Executor) -> generate.GenState:
        """Ends the stopped rows' turns (trimmed at a stop string found on text) and hands them to the env in
        one call on a worker thread."""
        lengths = np.full(len(run.rows), self.slots, np.int32)  # at least a row's length: kept whole
        for r in stopped:
            row = run.rows[r]
            row.end, row.text = self._finish_turn(row.snapshot[0], row.turn_start, row.length)
            row.phase = "env"
            if row.end < row.length:
                lengths[r] = row.end
        if (lengths < self.slots).any():
            state = self._dispatch(generate.truncate, state, self._to_device(lengths))
        turns = [(run.rows[r].text, len(run.rows[r].turns), self.config.max_len - run.rows[r].end >= 2)
                 for r in stopped]
        run.futures[pool.submit(self._env_turns, turns)] = stopped
        return state

    def _env_turns(self, turns: list[tuple[str, int, bool]]) -> list[tuple[Action, Observation | None]]:
        """On a worker thread: the env's action for each (turn text, turn index, room for an observation),
        and the observation of each that goes on, from one `env.observe` call."""
        actions = [self.env.parse_action(text, index) for text, index, _ in turns]
        asked = [k for k, ((_, _, room), action) in enumerate(zip(turns, actions))
                 if room and not action.done]
        observations = self.env.observe([actions[k] for k in asked]) if asked else []
        if len(observations) != len(asked):
            raise ValueError(f"The environment returned {len(observations)} observations for "
                             f"{len(asked)} actions.")
        answers: list[Observation | None] = [None] * len(turns)
        for k, obs in zip(asked, observations):
            answers[k] = obs
        return list(zip(actions, answers))

    def _take_observations(self, params, state: generate.GenState, run: _Run) -> generate.GenState:
        """Records the turns of every env call that returned, ends the episodes the env (or the slots) ended,
        and appends the observations, starting those rows' next turns."""
        ready = [f for f in run.futures if f.done()]
        if run.lockstep and len(ready) < len(run.futures):
            return state
        chunks: dict[int, list[int]] = {}
        for future in ready:
            for r, (action, obs) in zip(run.futures.pop(future), future.result()):
                row = run.rows[r]
                row.turns.append(Turn(row.turn_start, row.end, row.text, action))
                if obs is None:
                    run.finish(r, "done" if action.done else "length")
                    continue
                if not obs.text:
                    raise ValueError(f"Example {row.episode}: the environment returned an empty observation.")
                chunks[r] = self._observation_tokens(obs, self.config.max_len - row.end - 1)
                row.turns[-1].observation = self._decode(chunks[r])
                row.turns[-1].info.update(obs.info)
                row.phase = "decode"
        if not chunks:
            return state
        if self.branch is not None:
            branched = [r for r in chunks if run.rows[r].turns[-1].action.kind in self.branch.after_kinds]
            texts = self._side_branch(params, state, run, branched, chunks) if branched else {}
            for r, text in texts.items():
                run.rows[r].turns[-1].info[self.branch.name] = text
        return self._append(params, state, chunks, set(chunks), self.config.sampling)

    def _refill(self, params, state: generate.GenState, key: jax.Array, run: _Run, free: list[int]
                ) -> generate.GenState:
        """Starts the next waiting episodes in the `free` rows: emptied, keyed by episode, prefilled."""
        starts = dict(zip(free, (run.waiting.popleft() for _ in range(min(len(free), len(run.waiting))))))
        mask = np.isin(np.arange(len(run.rows)), list(starts))
        episodes = np.zeros(len(run.rows), np.int32)
        for r, e in starts.items():
            episodes[r] = run.first_row + e
            run.rows[r] = _Row(e)
        state = self._dispatch(generate.reset_rows, state, self._to_device(mask), key,
                               self._to_device(episodes), self.rules)
        return self._append(params, state, {r: run.prompts[e] for r, e in starts.items()}, set(starts),
                            self.config.sampling, prompt=not self.config.chunked_prefill)

    def _append(self, params, state: generate.GenState, sequences: dict[int, list[int]], start: set[int],
                sampling: SamplingParams, prompt: bool = False) -> generate.GenState:
        """Appends each row's tokens and starts the turns of the `start` rows. A prompt (`prompt`) goes in one
        call of `max_prompt_tokens`; otherwise a row's tokens go in chunks of at most the widest chunk
        width, aligned so that its last chunk comes in the last round, each chunk padded to its own bucket:
        one call per bucket in use, so that a row's computation does not depend on the other rows'."""
        batch = state.tokens.shape[0]
        widest = self.config.max_prompt_tokens if prompt else self.chunk_widths[-1]
        rounds = max(-(-len(s) // widest) for s in sequences.values())
        for left in range(rounds, 0, -1):  # `left` chunks to go, counted from each row's end
            pieces = {r: s[max(len(s) - left * widest, 0):max(len(s) - (left - 1) * widest, 0)]
                      for r, s in sequences.items()}
            widths = {r: widest if prompt else self._bucket(len(p)) for r, p in pieces.items()
                      if p or (left == 1 and r in start)}
            for width in sorted(set(widths.values())):
                group = [r for r, w in widths.items() if w == width]
                rows = [pieces[r] if r in group else [] for r in range(batch)]
                tokens, lengths = map(self._to_device, pad_batch(rows, width))
                starting = np.isin(np.arange(batch), [r for r in group if r in start] if left == 1 else [])
                state = self._dispatch(generate.extend, self.cfg, params, state, tokens, lengths,
                                       self._to_device(starting), sampling, self.rules, self.attention)
        return state

@dataclasses.dataclass
class _Row:
    """The episode a decode row runs, and where its current turn stands.

    phase: "decode" (generating on device), "stopped" (its turn ended; snapshot read), "env" (waiting for
    the env's answer)."""

    episode: int
    turns: list[Turn] = dataclasses.field(default_factory=list)
    phase: str = "decode"
    turn_start: int = 0
    length: int = 0  # slots used when the turn stopped
    end: int = 0  # the turn's end after trimming on text
    text: str = ""
    snapshot: tuple[np.ndarray, np.ndarray, np.ndarray] = ()  # tokens, sampled, logprobs of the row


@dataclasses.dataclass
class _Episodes:
    """The finished episodes of a rollout, on the host, one row each in episode order."""

    tokens: np.ndarray
    sampled: np.ndarray
    logprobs: np.ndarray
    prompt_lengths: np.ndarray
    lengths: np.ndarray
    turns: list[list[Turn]]
    finish: list[str]

    @classmethod
    def empty(cls, episodes: int, slots: int) -> _Episodes:
        return cls(np.zeros((episodes, slots), np.int32), np.zeros((episodes, slots), bool),
                   np.zeros((episodes, slots), np.float32), np.zeros(episodes, np.int32),
                   np.zeros(episodes, np.int32), [[] for _ in range(episodes)], [""] * episodes)

    def trajectory(self, logprob_temperature: float, side_branch: str | None) -> Trajectory:
        attention = np.arange(self.tokens.shape[1])[None, :] < self.lengths[:, None]
        return Trajectory(
            tokens=np.where(attention, self.tokens, 0).astype(np.int32),
            attention_mask=attention,
            loss_mask=(self.sampled & attention).astype(np.float32),
            logprobs=np.where(attention, self.logprobs, 0.0).astype(np.float32),
            prompt_lengths=self.prompt_lengths,
            lengths=self.lengths,
            turns=self.turns,
            finish_reasons=self.finish,
            logprob_temperature=logprob_temperature,
            side_branch=side_branch,
        )


@dataclasses.dataclass
class _Run:
    """The host's view of one rollout: the decode rows, the episodes waiting for one, the env calls out."""

    examples: Sequence[dict]
    prompts: list[list[int]]
    rows: list[_Row | None]
    first_row: int
    episodes: _Episodes
    lockstep: bool
    waiting: collections.deque = None
    futures: dict = dataclasses.field(default_factory=dict)  # env call -> the rows it answers
    decoded: np.ndarray = None  # each row's `GenState.decoded` when last read

    def __post_init__(self):
        self.waiting = collections.deque(range(len(self.examples)))
        self.decoded = np.zeros(len(self.rows), np.int32)

    def rows_in(self, phase: str) -> list[int]:
        return [r for r, row in enumerate(self.rows) if row is not None and row.phase == phase]

    def finish(self, r: int, reason: str) -> None:
        """Moves row r's episode, ended at its last turn, to the finished episodes and frees the row."""
        row, out = self.rows[r], self.episodes
        e = row.episode
        out.tokens[e], out.sampled[e], out.logprobs[e] = row.snapshot
        out.prompt_lengths[e], out.lengths[e] = len(self.prompts[e]), row.end
        out.turns[e], out.finish[e] = row.turns, reason
        self.rows[r] = None


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
