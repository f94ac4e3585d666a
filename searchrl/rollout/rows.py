"""The host's view of a rollout (`RolloutEngine`): its decode and parked rows and the episode or side branch
each runs, the episodes waiting for a row and those finished, and where the wall time went.

Everything here is host state: plain Python and NumPy, no jitted work (what runs on device is
`searchrl.rollout.generate`; which pages each row holds, `searchrl.rollout.pages`).
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Hashable, Sequence

import jax
import numpy as np

from searchrl import models
from searchrl.episode import Trajectory, Turn
from searchrl.rollout import generate
from searchrl.rollout.pages import PagePool


@dataclasses.dataclass
class RolloutStats:
    """Where a rollout's wall time went and how much of the decode batch did useful work.

    `device_s`: time the host waited for jitted work; `idle_s`: time the device had nothing to do while the
    host worked or waited for the env (an upper bound, `IdleClock`); `decode_row_steps`: rows x decode steps
    run; `decode_tokens`: the tokens those steps wrote (the other row-steps were rows waiting, finished or
    idle); `parks`: rows waiting for the env that were parked (`rollout.parked_rows`); `page_waits`: times a
    row or an episode waited for pages (`rollout.pool_pages`): a decode chunk sat out, an observation or a
    prompt held back a round; `shared_prompts`: episodes that started on another's prompt pages (a GRPO
    group's responses) instead of prefilling their own.
    """

    wall_s: float = 0.0
    device_s: float = 0.0
    idle_s: float = 0.0
    episodes: int = 0
    decode_row_steps: int = 0
    decode_tokens: int = 0
    parks: int = 0
    page_waits: int = 0
    shared_prompts: int = 0
    yields: int = 0
    asides: int = 0

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


class IdleClock:
    """Bounds the time the device had nothing to do, from the host's side: jitted calls run in order, so
    between two dispatches it idled at most the gap if the earlier call had finished by the later one, and not
    at all if it had not; after a call the host waited for, it idled until the next dispatch."""

    def __init__(self):
        self.idle_s, self._last, self._since = 0.0, None, time.perf_counter()

    def dispatching(self) -> None:
        if self._last is None or self._last.is_ready():
            self.idle_s += time.perf_counter() - self._since

    def dispatched(self, out) -> None:
        self._last, self._since = jax.tree.leaves(out)[0], time.perf_counter()

    def drained(self) -> None:
        self._last, self._since = None, time.perf_counter()

    def busy_until_now(self) -> None:
        """The host just waited for a call to finish: the device was busy until now."""
        self._since = time.perf_counter()


@dataclasses.dataclass(eq=False)
class Row:
    """The episode a decode row (or a parked row) runs, and where its current turn stands.

    phase: "decode" (generating on device), "stopped" (its turn ended; snapshot read), "env" (waiting for
    the env's answer), "observed" (its observation is in, to be appended)."""

    episode: int
    turns: list[Turn] = dataclasses.field(default_factory=list)
    phase: str = "decode"
    turn_start: int = 0
    length: int = 0  # slots used when the turn stopped
    end: int = 0  # the turn's end after trimming on text
    text: str = ""
    snapshot: tuple[np.ndarray, np.ndarray, np.ndarray] = ()  # tokens, sampled, logprobs of the row
    observation: list[int] = dataclasses.field(default_factory=list)  # its tokens, once "observed"
    cached: int = 0  # slots in the cache on device (what the next call's pages start from)
    shard: int = 0  # the block of rows its pages are on (kept while it is parked or waits for a row)
    parent: Row | None = None  # a side branch's episode (its tokens: `observation`)
    turn: int = 0  # the turn of `parent` a side branch follows
    start: int = 0  # the slot a side branch was forked at
    forks: int = 0  # an episode's side branches forked and not ended (decoding, or waiting for a row)

    @property
    def owner(self) -> Hashable:
        """Who holds the row's pages (`PagePool`): its episode, or its episode's side branch after a turn."""
        return self.episode if self.parent is None else ("branch", self.episode, self.turn)


@dataclasses.dataclass
class Episodes:
    """The finished episodes of a rollout, on the host, one row each in episode order."""

    tokens: np.ndarray
    sampled: np.ndarray
    logprobs: np.ndarray
    prompt_lengths: np.ndarray
    lengths: np.ndarray
    turns: list[list[Turn]]
    finish: list[str]

    @classmethod
    def empty(cls, episodes: int, slots: int) -> Episodes:
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
class Run:
    """The host's view of one rollout: the decode rows, the parked rows, the episodes waiting for a row, the
    env calls out."""

    examples: Sequence[dict]
    prompts: list[list[int]]
    rows: list[Row | None]
    parked: list[Row | None]
    first_row: int
    episodes: Episodes
    lockstep: bool
    pages: PagePool
    waiting: collections.deque = None
    futures: dict = dataclasses.field(default_factory=dict)  # env call -> the `Row`s it answers
    branches: list = dataclasses.field(default_factory=list)  # side branches forked, waiting for a row
    parking: generate.GenState | None = None  # the parked rows' state, on device
    key: jax.Array | None = None  # the rollout's key, on device
    held: set = dataclasses.field(default_factory=set)  # decode rows that sat out the last chunk for pages
    pool: models.KVPool | None = None  # the keys and values, on device
    table: np.ndarray | None = None  # the decode rows' page tables as last sent
    allowed: tuple | None = None  # the decode mask as last sent: (on the host, on device)
    decoded: np.ndarray = None  # each row's `GenState.decoded` when last read

    def __post_init__(self):
        self.waiting = collections.deque(range(len(self.examples)))
        self.decoded = np.zeros(len(self.rows), np.int32)

    def where(self) -> tuple:
        """Where every row and waiting episode stands: a round that leaves it unchanged with no env call
        out would repeat forever."""
        rows = tuple((row.episode, row.phase, row.cached, row.forks)
                     for row in self.rows + self.parked if row is not None)
        return len(self.waiting), len(self.branches), rows

    def rows_in(self, phase: str) -> list[int]:
        return [r for r, row in enumerate(self.rows) if row is not None and row.phase == phase]

    def parked_in(self, phase: str) -> list[Row]:
        return [row for row in self.parked if row is not None and row.phase == phase]

    def finish(self, row: Row, reason: str) -> None:
        """Moves `row`'s episode, ended at its last turn, to the finished episodes and frees its (decode or
        parked) row."""
        out, e = self.episodes, row.episode
        out.tokens[e], out.sampled[e], out.logprobs[e] = row.snapshot
        out.prompt_lengths[e], out.lengths[e] = len(self.prompts[e]), row.end
        out.turns[e], out.finish[e] = row.turns, reason
        self.pages.release(e)
        place = self.rows if row in self.rows else self.parked
        place[place.index(row)] = None
