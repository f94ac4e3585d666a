"""The host side of a rollout: continuous batching of episodes over a fixed set of decode rows, with the
environment's tool calls on host threads, overlapped with decoding.

A rollout of N episodes keeps `rollout.decode_rows` rows (the compiled batch) busy. Each round of the host
loop: append the observations the env returned (`extend` on `rollout.extend_rows` rows a call, per observation
bucket in use, which starts those rows' next turns) and prefill the next waiting prompts into free rows
(`reset_rows`, then `extend`) -> dispatch a decode chunk (asynchronous) -> while it runs, the rows that
stopped in the last chunk are re-checked for stops on text, trimmed, and handed to the env (`parse_action`,
then one `observe` call) on a worker thread -> read which rows the chunk stopped. A row ends when the env says
so or when its slots run out; its episode goes to the finished batch and the row is refilled. With
`rollout.parked_rows`, a row waiting for the env while episodes wait for a row is moved into a parked row
(page table, buffers and key: `generate.move_rows`; its pages stay) and the decode row takes another episode;
the parked episode moves back into a free row of its device once its observation is in, before new prompts.
An env's side branch (`episode.SideBranch`) after a turn is a fork: a row of its own in the same decode batch,
sharing its episode's pages up to the turn's end (its partial last page copied), decoded in the same chunks
as every other row (with its own prompt: in pages of its own), while its episode goes on; it waits for a free
row of its device, which it gets before any new episode; if its episode's next observation comes in first,
it takes its episode's row, the episode parked until a row frees up (with no parked row free, it runs at
once, aside, the other rows waiting). Every row holds the pages its next call writes (`searchrl.rollout.pages`);
one that cannot get them waits. `rollout.schedule="lockstep"` runs the same loop with every row's turn awaited
together: the env gets the batch's actions in one call once every row stopped, observations are appended once
all returned, rows are refilled once all are free.

Scheduling never changes an episode: episode i samples with the key of global row `first_row + i` and each
token with that key folded with its slot (`generate.init_state`), and every jitted call's shape for a row
depends on the row's own data only. The engine knows no task.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import re
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from searchrl import models
from searchrl.episode import Action, Env, Observation, SideBranch, Trajectory, Turn
from searchrl.rollout import generate
from searchrl.rollout.config import BRANCH_PROMPT_ROOM, RolloutConfig, SamplingParams, chunk_widths
from searchrl.rollout.pages import PagePool, pool_pages, reserve_pages
from searchrl.rollout.rows import Episodes, IdleClock, RolloutStats, Row, Run, pad_batch
from searchrl.text import chat


def first_stop_end(text: str, stop_strings: Sequence[str]) -> int | None:
    """End index of the earliest stop string in `text`, or None."""
    ends = [i + len(s) for s in stop_strings if (i := text.find(s)) >= 0]
    return min(ends) if ends else None


class RolloutEngine:
    """Runs batches of multi-turn episodes of one environment with one model.

    `side_branch=False` skips the env's side branch (the trajectories are the same; the turns lack its
    output). On the `placement`'s mesh, the rollout is sharded: rows data-parallel over its data and fsdp
    axes, heads and the MLP over its tensor axis (its sampling layout; attention computed as its attention
    says), the KV cache created in that layout, and the params moved into it once per rollout, device to
    device (`sampling_params`); with no mesh, on the default device. A mesh over several processes is the
    training mesh: each process rolls out its own rows on its block of it (`models.process_mesh`). Host
    arrays reach the device only through explicit transfers. With a `dtype` (the trainer's compute dtype),
    the rollout samples with the params cast to it, as the trainer scores them, and keeps its KV cache in
    it.
    """

    def __init__(self, cfg: models.ModelConfig, tokenizer: Any, env: Env, config: RolloutConfig,
                 side_branch: bool = True, dtype: str | None = None, *, placement: models.Placement):
        self.cfg, self.tokenizer, self.env, self.config = cfg, tokenizer, env, config
        mesh = placement.mesh
        self.train_mesh, self.mesh = mesh, mesh if mesh is None else models.process_mesh(mesh)
        self.dtype, self.compute = dtype, placement.sample
        self.eos_set = _eos_ids(tokenizer, cfg)
        self.eos_ids = self._replicated(jnp.asarray(sorted(self.eos_set), jnp.int32))
        stops = [generate.stop_table([self._encode(s) for s in env.stop_strings])]
        declared = env.side_branch
        self.chunk_widths = chunk_widths(config, declared)
        if declared is not None and not declared.separate_prompt:  # one more width: observation + its prompt
            self.branch_prompt = self._encode(declared.prompt)
            if len(self.branch_prompt) > BRANCH_PROMPT_ROOM:
                raise ValueError(f"Side branch {declared.name!r}: its prompt has {len(self.branch_prompt)} "
                                 f"tokens > {BRANCH_PROMPT_ROOM}.")
        # The shapes depend on the declared branch only, so a run without it is the same computation.
        self.slots = config.slots(self.chunk_widths[-1])
        self.table_width = -(-self.slots // config.page_size)  # page table entries of a row
        self.branch: SideBranch | None = declared if side_branch else None
        limits = None
        if self.branch is not None:
            limits = generate.TurnLimits(self.branch.max_tokens, self.slots - 1, self.branch.sampling)
            stops.append(generate.stop_table([self._encode(s) for s in self.branch.stop_strings]))
        self.stops = tuple(self._replicated(table) for table in stops)
        self.spec = generate.DecodeSpec(config.max_turn_tokens, config.max_len, config.sampling,
                                        steps=config.chunk_steps, branch=limits, compute=self.compute)
        self.stats = RolloutStats()
        self._idle = IdleClock()
        self._warmup_key = jax.random.key(0)  # made here: a key from a Python int is a host transfer

    @property
    def rules(self) -> models.ShardingRules:
        """The sampling layout (`compute.rules`): of the params, the KV cache and the rows' state."""
        return self.compute.rules

    def sampling_params(self, params):
        """The policy's params as the rollout samples with them: cast to the engine's `dtype`, and on its mesh
        in the sampling layout (`rules`), both on device (e.g. from the trainer's float32 FSDP layout,
        never through the host), then split into per-layer arrays (`models.unstack_layers`) that every step
        reads in place. Across processes, every process gets a whole copy on its own devices."""
        if self.dtype is not None and jax.tree.leaves(params)[0].dtype != jnp.dtype(self.dtype):
            params = _cast(params, self.dtype)
        if self.mesh is not None:
            params = jax.device_put(params, models.param_shardings(self.cfg, self.train_mesh, self.rules))
            params = models.to_process_mesh(params, self.mesh)
        return _unstacked(params)

    def _replicated(self, x: jax.Array | np.ndarray) -> jax.Array:
        """`x` put on every device of the mesh (on the default device without one), explicitly."""
        return jax.device_put(x, None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec()))

    def _to_device(self, x):
        """Host arrays of per-row values (an array or a tuple of them, in one call) put on device
        explicitly (never handed to a jitted call as is: an implicit transfer), rows sharded over the mesh's
        data axes."""
        if self.mesh is None:
            return jax.device_put(x)
        shardings = jax.tree.map(lambda a: models.rows_sharding(a.shape, self.mesh, self.rules), x)
        return jax.device_put(x, shardings)

    def _new_state(self, batch: int, key: jax.Array, first_row: int = 0) -> generate.GenState:
        return self._call(generate.new_state, batch, self.slots, self.config.page_size, self._replicated(key),
                          self._replicated(np.int32(first_row)), self.rules)

    def shards(self, batch: int) -> int:
        """Blocks of rows (and pools of pages) a `batch`-row state is split into: one per device along the
        mesh's data axes."""
        return 1 if self.mesh is None else models.row_shards(dict(self.mesh.shape), self.rules, batch)

    def reserve(self) -> int:
        """Pages an episode holds at its largest: its row's slots, and a side branch's beside them."""
        return reserve_pages(self.table_width, self.branch is not None)

    def pool_pages(self, batch: int) -> int:
        """Pages per device of a rollout on `batch` decode rows (`rollout.pool_pages`; 0: every decode and
        parked row at its largest)."""
        return pool_pages(self.config, batch, self.shards(batch), self.table_width, self.branch is not None)

    def _new_pool(self, params, batch: int) -> models.KVPool:
        """An empty page pool beside a `batch`-row state, in the params' dtype, pages with their rows."""
        dtype = jax.tree.leaves(params)[0].dtype
        pages = self.pool_pages(batch) * self.shards(batch)
        sharding = None if self.mesh is None else models.pool_sharding(self.cfg, self.mesh, self.rules,
                                                                                   batch)
        return _empty_pool(self.cfg, pages, self.config.page_size, dtype, sharding)

    def warmup(self, params, episodes: int) -> None:
        """Compiles every program a rollout of `episodes` episodes can use: none compiles afterwards."""
        params = self.sampling_params(params)
        batch = self.rows(episodes)
        key = self._replicated(self._warmup_key)
        state, pool = self._new_state(batch, key), self._new_pool(params, batch)
        idle, zeros = self._to_device((np.zeros(batch, bool), np.zeros(batch, np.int32)))
        state = self._call(generate.reset_rows, state, idle, key, zeros, zeros, idle, self.rules)
        self._call(generate.progress, state)
        state = self._call(generate.set_pages, state, self._to_device(np.zeros((batch, self.table_width),
                                                                                np.int32)), self.rules)
        pool = self._call(generate.copy_pages, pool, *self._copies({}, batch), batch, self.rules)
        state = self._call(generate.copied, state)
        samplers = [self.config.sampling] + ([] if self.branch is None else [self.branch.sampling])
        (_, computed), = self._append_calls([], batch)
        rows = batch if computed is None else len(computed)
        for sampling in dict.fromkeys(samplers):
            widths = self.chunk_widths + (() if self.config.chunked_prefill else (self.config.max_prompt_tokens,))
            for width in widths:
                inputs = self._to_device((self._local(computed, batch), *pad_batch([[]] * rows, width),
                                          np.zeros(rows, bool)))
                pool, state = self._call(generate.extend, self.cfg, params, pool, state, *inputs, sampling,
                                         self.compute, self._to_device(self._joins({}, batch, rows)))
        pool, state = self._call(generate.decode_chunk, self.cfg, params, pool, state, idle, self.stops,
                                 self.eos_ids, self.spec)
        state = self._call(generate.truncate, state, zeros)
        for rows in _read_buckets(batch):
            self._call(generate.rows_of, state, self._replicated(np.zeros(rows, np.int32)))
        if self._parks():
            parking = self._new_state(self.config.parked_rows, key)
            parking = self._call(generate.move_rows, state, parking, *self._moves([], parking), self.rules)
            self._call(generate.move_rows, parking, state, *self._moves([], state), self.rules)

    def _parks(self) -> bool:
        """Whether rows waiting for the env are parked (`rollout.parked_rows`; the continuous schedule)."""
        return self.config.parked_rows > 0 and self.config.schedule == "continuous"

    def _call(self, fn: Callable, *args) -> Any:
        """Runs a jitted call to completion, under the engine's mesh."""
        self._idle.dispatching()
        with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
            out = jax.block_until_ready(fn(*args))
        self._idle.drained()
        return out

    def _device(self, fn: Callable, *args) -> Any:
        """`_call`, counting its time as device time."""
        start = time.perf_counter()
        out = self._call(fn, *args)
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

    def _start_forks(self, params, state: generate.GenState, run: Run,
                     starts: dict[int, Row] | None = None) -> generate.GenState:
        """Starts the side branches waiting for a row (their pages forked: `_fork_branch`), oldest first, in
        the free rows of their episode's device (or in the rows `starts` gives them), at the slot their
        episode had reached: their tokens (the observation and the branch's prompt, or their own prompt)
        appended, their turn started; they decode in the chunks that follow, beside every other row. The
        others wait for a row to free up."""
        if starts is None:
            starts = {}
            for fork in list(run.branches):
                free = [r for r, row in enumerate(run.rows) if row is None and self._shard(r, run) == fork.shard
                        and r not in starts]
                if free:
                    starts[free[0]] = fork
                    run.branches.remove(fork)
        if not starts:
            return state
        for r, fork in starts.items():
            run.rows[r] = fork
        state = self._reset(state, run, starts)
        state = self._sync_pages(state, run)
        return self._append(params, state, run, {r: fork.observation for r, fork in starts.items()}, set(starts),
                            self.branch.sampling)

    def _reset(self, state: generate.GenState, run: Run, rows: dict[int, Row]) -> generate.GenState:
        """`state` with `rows` (row -> its episode or side branch) emptied and keyed for them
        (`generate.reset_rows`); a side branch starts at its fork slot."""
        mask, branch = np.zeros(len(run.rows), bool), np.zeros(len(run.rows), bool)
        episodes, start = np.zeros(len(run.rows), np.int32), np.zeros(len(run.rows), np.int32)
        for r, row in rows.items():
            mask[r], branch[r], episodes[r] = True, row.parent is not None, run.first_row + row.episode
            start[r] = row.start
        inputs = self._to_device((mask, episodes, start, branch))
        return self._dispatch(generate.reset_rows, state, inputs[0], run.key, *inputs[1:], self.rules)

    def _yield_to_forks(self, params, state: generate.GenState, run: Run, overdue: list[Row]
                        ) -> tuple[generate.GenState, list[Row]]:
        """Starts side branches whose episode's next observation came in before they got a row in their
        episode's row, the episode parked (its observation appended once it is back in a row), as far as
        parked rows are free: the branch decodes beside every other row, where running it aside would stop
        them all. Returns the state and the branches left to run aside."""
        starts, moves, aside = {}, [], []
        for fork in overdue:
            if None not in run.parked:
                aside.append(fork)
                continue
            r, p = run.rows.index(fork.parent), run.parked.index(None)
            fork.parent.shard = self._shard(r, run)
            run.parked[p], run.rows[r] = fork.parent, None
            moves.append((r, p))
            starts[r] = fork
        if moves:
            self.stats.yields += len(moves)
            run.parking = self._dispatch(generate.move_rows, state, run.parking, *self._moves(moves, run.parking),
                                         self.rules)
            state = self._start_forks(params, state, run, starts)
        return state, aside

    def _branch_aside(self, params, state: generate.GenState, run: Run, forks: list[Row]) -> None:
        """Runs side branches at once, each in its episode's row of a copy of the rows' bookkeeping (the
        episodes wait; the branches' pages were forked as for a row of their own), and ends them: a branch
        still waiting for a row when its episode's next observation is in and no parked row is free."""
        self.stats.asides += len(forks)
        rows = {run.rows.index(fork.parent): fork for fork in forks}
        aside = self._reset(self._dispatch(generate.copied, state), run, rows)
        table = run.pages.table([rows[r].owner if r in rows else None for r in range(len(run.rows))],
                                self.table_width)
        aside = self._dispatch(generate.set_pages, aside, self._to_device(table), self.rules)
        aside = self._append(params, aside, run, {r: fork.observation for r, fork in rows.items()}, set(rows),
                             self.branch.sampling)
        active, decoded = jax.device_get(self._call(generate.progress, aside))
        mask = np.isin(np.arange(len(run.rows)), list(rows))
        allowed = self._to_device(mask)
        while (active & mask).any():
            run.pool, aside = self._device(generate.decode_chunk, self.cfg, params, run.pool, aside, allowed,
                                           self.stops, self.eos_ids, self.spec)
            active, now = jax.device_get(self._call(generate.progress, aside))
            self._count_steps(decoded, now)
            decoded = now
        tokens, _, _, turn_start, length = self._read_rows(aside, list(rows))
        for k, fork in enumerate(rows.values()):
            self._end_branch(run, fork, tokens[k], int(turn_start[k]), int(length[k]))

    def _end_branch(self, run: Run, fork: Row, tokens: np.ndarray, turn_start: int, length: int) -> None:
        """Ends a side branch: its text (cut after the first stop string) into its episode's turn, its pages
        back to the pool."""
        text = self._decode(tokens[turn_start:length])
        stop = first_stop_end(text, self.branch.stop_strings)
        fork.parent.turns[fork.turn].info[self.branch.name] = text if stop is None else text[:stop]
        fork.parent.forks -= 1
        run.pages.release(fork.owner)

    def _branch_sequence(self, run: Run, r: int) -> list[int]:
        """What row `r`'s side branch appends: its observation and the branch's prompt, or the env's
        separate branch prompt."""
        row = run.rows[r]
        if not self.branch.separate_prompt:
            return row.observation + self.branch_prompt
        sequence = self._encode(chat.render(self.tokenizer, self.env.side_branch_prompt(
            run.examples[row.episode], row.turns)))
        room = self.slots - 1 - self.branch.max_tokens
        if len(sequence) > room:
            raise ValueError(f"Side branch {self.branch.name!r}: a prompt has {len(sequence)} tokens, more "
                             f"than the {room} a row has room for before its {self.branch.max_tokens} "
                             "(raise rollout.max_prompt_tokens: it adds slots to every row).")
        return sequence

    def _fork_branch(self, run: Run, r: int, sequence: list[int], copies: dict[int, list]) -> Row | None:
        """Row `r`'s side branch after its last turn (to start: `_start_forks`) with its pages, in its
        episode's family: its episode's so far shared (a partial last one copied, added to `copies`; none
        for a separate prompt), room for `sequence` and the branch's tokens; None (nothing taken) if its
        device cannot spare them."""
        row, shard = run.rows[r], self._shard(r, run)
        start = 0 if self.branch.separate_prompt else row.cached
        fork = Row(row.episode, parent=row, turn=len(row.turns) - 1, shard=shard, observation=sequence,
                    start=start, cached=start + len(sequence))  # its cache once its tokens are appended
        grow_to = min(fork.start + len(sequence) + self.branch.max_tokens, self.slots)
        forked = run.pages.fork(row.episode, fork.owner, fork.start, grow_to)
        if forked is not None and forked.copy is not None:
            copies.setdefault(shard, []).append(forked.copy)
        return None if forked is None else fork

    def run(self, params, examples: Sequence[dict], key: jax.Array, first_row: int = 0) -> Trajectory:
        """Rolls out one episode per example; returns them in order, one row each. Adds to `self.stats`.

        The examples are episodes `first_row` .. of a global batch (a process's share): each samples with its
        global index (`generate.reset_rows`), so its tokens depend neither on how the batch is split nor on
        the row or the schedule it runs in."""
        start = time.perf_counter()
        self._idle = IdleClock()
        trajectory = self._run(params, examples, key, first_row)
        self.stats.wall_s += time.perf_counter() - start
        self.stats.idle_s += self._idle.idle_s
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
        parked = self.config.parked_rows if self._parks() else 0
        batch = self.rows(len(examples))
        pages = PagePool(self.shards(batch), self.pool_pages(batch), self.config.page_size, self.reserve())
        run = Run(examples, prompts, [None] * batch, [None] * parked, first_row,
                  Episodes.empty(len(examples), self.slots), self.config.schedule == "lockstep", pages)
        state, run.pool = self._new_state(batch, key, first_row), self._new_pool(params, batch)
        if parked:
            run.parking = self._new_state(parked, key, first_row)
        run.key = self._replicated(key)
        with concurrent.futures.ThreadPoolExecutor(self.config.env_workers) as pool:
            while run.waiting or run.branches or any(row is not None for row in run.rows + run.parked):
                state = self._step(params, state, run, pool)
        return run.episodes.trajectory(self.config.sampling.logprob_temperature,
                                       None if self.branch is None else self.branch.name)

    def _step(self, params, state: generate.GenState, run: Run, pool: concurrent.futures.Executor
              ) -> generate.GenState:
        """One round of the host loop: append the observations that came back (parked episodes first moved
        back into free rows; side branches forked) and refill free rows, as far as pages allow; dispatch a
        decode chunk of the generating rows that got pages for it; send the rows that stopped to the env
        while it runs (parking them if episodes wait for a row), then read which rows the chunk stopped.
        With nothing to decode, wait for the env (the device idles); with nothing else either, a round that
        changed nothing would repeat forever: a clear error instead."""
        before = run.where()
        moving = [r for r in run.rows_in("decode") if r not in run.held]  # not waiting for pages
        if (run.futures or run.parked_in("observed") or run.rows_in("observed")) and not (
                run.lockstep and (moving or run.rows_in("stopped"))):
            state = self._take_observations(params, state, run)
        if run.branches:  # those forked this round too; before new episodes: they hold their pages already
            state = self._start_forks(params, state, run)
        free = [r for r, row in enumerate(run.rows) if row is None]
        if run.waiting and free and not (run.lockstep and len(free) < len(run.rows)):
            state = self._refill(params, state, run, free)
        decoding, probe = run.rows_in("decode"), None
        allowed = self._grant_decode(run, decoding)
        if allowed.any():
            state = self._sync_pages(state, run)
            run.pool, state = self._dispatch(generate.decode_chunk, self.cfg, params, run.pool, state,
                                             self._sent_mask(run, allowed), self.stops, self.eos_ids, self.spec)
            probe = self._dispatch(generate.progress, state)
        stopped = run.rows_in("stopped")
        if stopped and not (run.lockstep and allowed.any()):
            state = self._send_to_env(state, run, stopped, pool)
        if run.parked:
            self._park(state, run)
        if probe is not None:
            self._read_stops(state, run, decoding, probe)
        elif run.futures:
            self._wait_for_env(run)
        elif run.where() == before:
            raise RuntimeError(f"Rollout stalled: no row could go on ({run.pages.in_use()} pages in use, "
                               f"{len(run.waiting)} episodes waiting for a row); raise rollout.pool_pages.")
        return state

    def _shard(self, r: int, run: Run) -> int:
        """The block of rows (device along the data axes) decode row `r` is on: its pages are there."""
        return r // (len(run.rows) // run.pages.shards)

    def _local(self, rows: list[int] | None, batch: int) -> np.ndarray | None:
        """Rows' indices within their block of rows (what `generate.extend` takes under a mesh)."""
        return None if rows is None else np.asarray(rows, np.int32) % (batch // self.shards(batch))

    def _copies(self, copies: dict[int, list[tuple[int, int]]], batch: int) -> tuple[jax.Array, jax.Array]:
        """(source, target) pages of each block of rows (`copies[shard]`, at most one a row) as the
        `generate.copy_pages` arrays: an equal share per block, the unused pairs aimed past the pool."""
        shards = self.shards(batch)
        per_shard, past = batch // shards, self.pool_pages(batch)
        pairs = np.zeros((2, shards, per_shard), np.int32)
        pairs[1] = past
        for shard, listed in copies.items():
            pairs[:, shard, :len(listed)] = np.asarray(listed, np.int32).T
        return self._to_device((pairs[0].ravel(), pairs[1].ravel()))

    def _sync_pages(self, state: generate.GenState, run: Run) -> generate.GenState:
        """`state` with the decode rows' page tables as the host holds them (sent when they changed)."""
        table = run.pages.table([None if row is None else row.owner for row in run.rows], self.table_width)
        if run.table is not None and np.array_equal(table, run.table):
            return state
        run.table = table
        return self._dispatch(generate.set_pages, state, self._to_device(table), self.rules)

    def _sent_mask(self, run: Run, allowed: np.ndarray) -> jax.Array:
        """`allowed` on device: the copy sent last when it has not changed (most chunks)."""
        if run.allowed is None or not np.array_equal(run.allowed[0], allowed):
            run.allowed = allowed, self._to_device(allowed)
        return run.allowed[1]

    def _grant_decode(self, run: Run, decoding: list[int]) -> np.ndarray:
        """Which decode rows may run the next chunk [B] bool: those that got the pages its steps write,
        oldest episode first (the others sit it out: `PagePool`)."""
        allowed = np.zeros(len(run.rows), bool)
        for r in sorted(decoding, key=lambda r: run.rows[r].episode):
            row = run.rows[r]
            limit = self.config.max_len if row.parent is None else min(
                row.start + len(row.observation) + self.branch.max_tokens, self.slots)  # what it may write
            want = min(row.cached + self.spec.steps, limit)
            allowed[r] = run.pages.grow(row.owner, self._shard(r, run), want)
        run.held = {r for r in decoding if not allowed[r]}
        self.stats.page_waits += len(run.held)
        return allowed

    def _dispatch(self, fn: Callable, *args) -> Any:
        """Starts a jitted call under the engine's mesh without waiting for it (dispatch is asynchronous)."""
        self._idle.dispatching()
        with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
            out = fn(*args)
        self._idle.dispatched(out)
        return out

    def _read_stops(self, state: generate.GenState, run: Run, decoding: list[int], probe) -> None:
        """Waits for the chunk, counts its useful row-steps, and snapshots the rows it stopped."""
        active, decoded = self._read(probe)
        self._count_steps(run.decoded, decoded)
        for r in decoding:
            run.rows[r].cached += int(decoded[r] - run.decoded[r])
        run.decoded = decoded
        stopped = [r for r in decoding if not active[r]]
        if not stopped:
            return
        tokens, sampled, logprobs, turn_start, length = self._read_rows(state, stopped)
        for k, r in enumerate(stopped):
            row = run.rows[r]
            if row.parent is not None:
                self._end_branch(run, row, tokens[k], int(turn_start[k]), int(length[k]))
                run.rows[r] = None
                continue
            row.phase, row.turn_start, row.length = "stopped", int(turn_start[k]), int(length[k])
            row.snapshot = (tokens[k], sampled[k], logprobs[k])

    def _read_rows(self, state: generate.GenState, rows: list[int]) -> tuple[np.ndarray, ...]:
        """`generate.rows_of` the `rows` on the host (and no other row), their count padded to a bucket
        (`_read_buckets`: programs compiled at warm-up)."""
        index = np.full(_read_bucket(len(rows), state.tokens.shape[0]), rows[0], np.int32)
        index[:len(rows)] = rows
        return self._read(self._dispatch(generate.rows_of, state, self._replicated(index)))

    def _read(self, arrays):
        """The host copy of device `arrays`, waiting for them (device time)."""
        start = time.perf_counter()
        busy = not all(a.is_ready() for a in jax.tree.leaves(arrays))
        out = jax.device_get(arrays)
        self.stats.device_s += time.perf_counter() - start
        if busy:
            self._idle.busy_until_now()
        return out

    def _count_steps(self, before: np.ndarray, after: np.ndarray) -> None:
        """Adds one chunk's decode row-steps (rows x steps: the longest row's advance) and useful ones."""
        advance = np.asarray(after) - np.asarray(before)
        self.stats.decode_tokens += int(advance.sum())
        self.stats.decode_row_steps += int(advance.max(initial=0)) * len(advance)

    def _wait_for_env(self, run: Run) -> None:
        """Blocks until the env answers (every call under lock step): the device has nothing to do."""
        when = concurrent.futures.ALL_COMPLETED if run.lockstep else concurrent.futures.FIRST_COMPLETED
        concurrent.futures.wait(run.futures, return_when=when)

    def _send_to_env(self, state: generate.GenState, run: Run, stopped: list[int],
                     pool: concurrent.futures.Executor) -> generate.GenState:
        """Ends the stopped rows' turns (trimmed at a stop string found on text; pages past the end taken
        back) and hands them to the env in one call on a worker thread."""
        lengths = np.full(len(run.rows), self.slots, np.int32)  # at least a row's length: kept whole
        for r in stopped:
            row = run.rows[r]
            row.end, row.text = self._finish_turn(row.snapshot[0], row.turn_start, row.length)
            row.phase, row.cached = "env", row.end
            run.pages.truncate(row.episode, row.end)
            if row.end < row.length:
                lengths[r] = row.end
        if (lengths < self.slots).any():
            state = self._dispatch(generate.truncate, state, self._to_device(lengths))
        rows = [run.rows[r] for r in stopped]
        turns = [(row.episode, row.text, len(row.turns), self.config.max_len - row.end - 1) for row in rows]
        run.futures[pool.submit(self._env_turns, turns)] = rows
        return state

    def _park(self, state: generate.GenState, run: Run) -> None:
        """Moves rows waiting for the env into free parked rows, as many as episodes wait for a decode row
        beyond the free ones (a moved row is free at the next round). The episode keeps its pages (its page
        table moves with it) and comes back to a row on the same device."""
        free = sum(row is None for row in run.rows)
        wanted = len(run.waiting) + len(run.parked_in("observed")) - free
        moves = []
        for r in run.rows_in("env")[:max(wanted, 0)]:
            if None not in run.parked:
                break
            p = run.parked.index(None)
            run.rows[r].shard = self._shard(r, run)
            run.parked[p], run.rows[r] = run.rows[r], None
            moves.append((r, p))
        self.stats.parks += len(moves)
        if moves:
            run.parking = self._dispatch(generate.move_rows, state, run.parking, *self._moves(moves, run.parking),
                                         self.rules)

    def _unpark(self, state: generate.GenState, run: Run) -> generate.GenState:
        """Moves parked episodes whose observation is in back into free decode rows on their own device,
        first in first out."""
        moves = []
        for row in run.parked_in("observed"):
            free = [r for r, held in enumerate(run.rows) if held is None and self._shard(r, run) == row.shard]
            if not free:
                continue
            p = run.parked.index(row)
            run.rows[free[0]], run.parked[p] = row, None
            moves.append((p, free[0]))
        if not moves:
            return state
        return self._dispatch(generate.move_rows, run.parking, state, *self._moves(moves, state), self.rules)

    def _moves(self, pairs: list[tuple[int, int]], target: generate.GenState) -> tuple[jax.Array, jax.Array]:
        """`generate.move_rows`' (source rows, target rows) of a round's (source, target) `pairs`: always
        `rollout.parked_rows` of them (one program each way), the unused aimed past `target`'s rows."""
        rows = np.zeros((2, self.config.parked_rows), np.int32)
        rows[1] = target.tokens.shape[0] + np.arange(self.config.parked_rows)
        rows[:, :len(pairs)] = np.asarray(pairs, np.int32).reshape(-1, 2).T
        return self._replicated(rows[0]), self._replicated(rows[1])

    def _env_turns(self, turns: list[tuple[int, str, int, int]]) -> list[_Answer]:
        """On a worker thread: the env's answer to each (episode, turn text, turn index, slots left for an
        observation): its action, and the observation of each that goes on (from one `env.observe` call),
        tokenised and truncated to the room left."""
        actions = [self.env.parse_action(text, index) for _, text, index, _ in turns]
        asked = [k for k, (turn, action) in enumerate(zip(turns, actions)) if turn[3] > 0 and not action.done]
        observations = self.env.observe([actions[k] for k in asked]) if asked else []
        if len(observations) != len(asked):
            raise ValueError(f"The environment returned {len(observations)} observations for "
                             f"{len(asked)} actions.")
        answers = [_Answer(action) for action in actions]
        for k, obs in zip(asked, observations):
            if not obs.text:
                raise ValueError(f"Example {turns[k][0]}: the environment returned an empty observation.")
            tokens = self._observation_tokens(obs, turns[k][3])
            answers[k] = _Answer(actions[k], obs, tokens, self._decode(tokens))
        return answers

    def _take_observations(self, params, state: generate.GenState, run: Run) -> generate.GenState:
        """Records the turns of every env call that returned, ends the episodes the env (or the slots) ended,
        and appends the observations, starting those rows' next turns."""
        ready = [f for f in run.futures if f.done()]
        if run.lockstep and len(ready) < len(run.futures):
            return state
        for future in ready:
            for row, answer in zip(run.futures.pop(future), future.result()):
                row.turns.append(Turn(row.turn_start, row.end, row.text, answer.action))
                if answer.observation is None:
                    run.finish(row, "done" if answer.action.done else "length")
                    continue
                row.observation = answer.tokens
                row.turns[-1].observation = answer.text
                row.turns[-1].info.update(answer.observation.info)
                row.phase = "observed"
        if run.parked:
            state = self._unpark(state, run)
        if run.branches:
            state = self._start_forks(params, state, run)
        if overdue := [b for b in run.branches if b.parent.phase == "observed" and b.parent in run.rows]:
            run.branches = [b for b in run.branches if b not in overdue]
            state, aside = self._yield_to_forks(params, state, run, overdue)
            if aside:
                self._branch_aside(params, state, run, aside)
        chunks, copies = self._grant_observations(run)
        if not chunks:
            return state
        state = self._sync_pages(state, run)
        if copies:  # before the episodes write into the pages their side branches copy
            run.pool = self._dispatch(generate.copy_pages, run.pool, *self._copies(copies, len(run.rows)),
                                      len(run.rows), self.rules)
        for r in chunks:
            run.rows[r].phase = "decode"
        return self._append(params, state, run, chunks, set(chunks), self.config.sampling)

    def _grant_observations(self, run: Run) -> tuple[dict[int, list[int]], dict]:
        """The observations to append now, oldest episode first: (row -> its observation, the pages their
        side branches copy per device), for the rows that got the pages their observation needs and whose
        side branch could be forked (its previous one done; the fork joins `run.branches`); the others wait
        a round."""
        chunks, copies = {}, {}
        for r in sorted(run.rows_in("observed"), key=lambda r: run.rows[r].episode):
            row = run.rows[r]
            if not run.pages.grow(row.episode, self._shard(r, run), row.cached + len(row.observation)):
                self.stats.page_waits += 1
                continue
            if self.branch is not None and row.turns[-1].action.kind in self.branch.after_kinds:
                fork = None if row.forks else self._fork_branch(run, r, self._branch_sequence(run, r), copies)
                if fork is None:
                    self.stats.page_waits += not row.forks
                    continue
                row.forks += 1
                run.branches.append(fork)
            chunks[r] = row.observation
            row.cached += len(row.observation)
        return chunks, copies

    def _refill(self, params, state: generate.GenState, run: Run, free: list[int]) -> generate.GenState:
        """Starts the next waiting episodes in the `free` rows that can take their prompt's pages: emptied,
        keyed by episode, prefilled. Episodes of the same prompt (a GRPO group) starting on one device share
        its pages: the first prefills it, the others join it (`generate.extend`'s `joins`), each then
        copying the partial last page."""
        starts, joins, copies, leaders = {}, {}, {}, {}
        for r in free:
            if not run.waiting:
                break
            e, shard = run.waiting[0], self._shard(r, run)
            prompt = run.prompts[e]
            leader = leaders.get((shard, tuple(prompt)))
            if leader is None:
                taken = run.pages.grow(e, shard, len(prompt))
            else:
                forked = run.pages.fork(run.rows[leader].episode, e, len(prompt), len(prompt), family=e)
                taken = forked is not None
                if taken and forked.copy is not None:
                    copies.setdefault(shard, []).append(forked.copy)
            if not taken:
                self.stats.page_waits += 1
                continue
            if leader is None:
                leaders[shard, tuple(prompt)] = r
            else:
                joins[r] = leader
            starts[r] = run.waiting.popleft()
            run.rows[r] = Row(e, cached=len(prompt))
        if not starts:
            return state
        state = self._reset(state, run, {r: run.rows[r] for r in starts})
        state = self._sync_pages(state, run)
        self.stats.shared_prompts += len(joins)
        prefilled = {r: run.prompts[e] for r, e in starts.items() if r not in joins}
        state = self._append(params, state, run, prefilled, set(prefilled), self.config.sampling,
                             prompt=not self.config.chunked_prefill, joins=joins)
        if copies:  # after the prompts are in their pages, before anyone writes past them
            run.pool = self._dispatch(generate.copy_pages, run.pool, *self._copies(copies, len(run.rows)),
                                      len(run.rows), self.rules)
        return state

    def _append(self, params, state: generate.GenState, run: Run, sequences: dict[int, list[int]],
                start: set[int], sampling: SamplingParams, prompt: bool = False,
                joins: dict[int, int] | None = None) -> generate.GenState:
        """Appends each row's tokens (into the pages it holds) and starts the turns of the `start` rows. A
        prompt (`prompt`) goes in one call of `max_prompt_tokens`; otherwise a row's tokens go in chunks of at
        most the widest chunk width, aligned so that its last chunk comes in the last round, each chunk
        padded to its own bucket: one call per bucket in use, so that a row's computation does not depend on
        the other rows'. The rows of `joins` (row -> a `start` row of the same device) start their turn on
        that row's tokens in the call that starts it."""
        joins = joins or {}
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
                for part, computed in self._append_calls(group, batch):
                    order = range(batch) if computed is None else computed
                    tokens, lengths = pad_batch([pieces[r] if r in part else [] for r in order], width)
                    starting = np.asarray([left == 1 and r in part and r in start for r in order])
                    joined = self._joins({m: order.index(r) for m, r in joins.items()
                                          if left == 1 and r in part and r in start}, batch, len(order))
                    *inputs, joined = self._to_device((self._local(computed, batch), tokens, lengths, starting,
                                                       joined))
                    run.pool, state = self._dispatch(generate.extend, self.cfg, params, run.pool, state, *inputs,
                                                     sampling, self.compute, joined)
        return state

    def _joins(self, sources: dict[int, int], batch: int, computed: int) -> np.ndarray:
        """`generate.extend`'s `joins` [batch]: row m starts on the k-th of a call's `computed` rows
        (`sources[m]` = k; local to its device's block under a mesh), -1 for the other rows."""
        joins = np.full(batch, -1, np.int32)
        for m, k in sources.items():
            joins[m] = k % (computed // self.shards(batch))
        return joins

    def _append_calls(self, rows: list[int], batch: int) -> list[tuple[list[int], list[int] | None]]:
        """The append calls for `rows` of a `batch`-row state: each call's (rows it appends to, rows it
        computes; None: all). A call computes `rollout.extend_rows` rows (rounded up to an equal share of
        each block of rows: a row is computed on its own device), filled up with rows of the same block that
        append nothing."""
        shards = self.shards(batch)
        per_shard = batch // shards
        share = min(-(-(self.config.extend_rows or batch) // shards), per_shard)
        if share == per_shard:
            return [(rows, None)]
        blocks = [[r for r in rows if r // per_shard == s] for s in range(shards)]
        calls = []
        for i in range(0, max(max(map(len, blocks)), 1), share):
            part, computed = [], []
            for s, block in enumerate(blocks):
                mine = block[i:i + share]
                filler = [r for r in range(s * per_shard, (s + 1) * per_shard) if r not in mine]
                part += mine
                computed += mine + filler[:share - len(mine)]
            calls.append((part, computed))
        return calls


class _Answer(NamedTuple):
    """The env's answer to one turn: its action, and the observation if the episode goes on (with its tokens
    as appended, truncated, and their text)."""

    action: Action
    observation: Observation | None = None
    tokens: list[int] = []
    text: str = ""


_CLOSING_TAG = re.compile(r"</[A-Za-z_]+>\s*\Z")


def _read_bucket(rows: int, batch: int) -> int:
    """Rows a read of `rows` stopped rows takes: the next power of two, at most the batch."""
    return min(1 << (rows - 1).bit_length(), batch)


def _read_buckets(batch: int) -> list[int]:
    """Every `_read_bucket` of a `batch`-row state."""
    return sorted({_read_bucket(rows, batch) for rows in range(1, batch + 1)})


@functools.partial(jax.jit, static_argnames=("dtype",))
def _cast(params, dtype: str):
    return jax.tree.map(lambda p: p.astype(dtype), params)


_unstacked = jax.jit(models.unstack_layers)


@functools.partial(jax.jit, static_argnames=("cfg", "pages", "page_size", "dtype", "sharding"))
def _empty_pool(cfg: models.ModelConfig, pages: int, page_size: int, dtype, sharding) -> models.KVPool:
    pool = models.KVPool.init(cfg, pages, page_size, dtype)
    return pool if sharding is None else jax.lax.with_sharding_constraint(pool, sharding)


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
