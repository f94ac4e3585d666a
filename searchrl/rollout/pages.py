"""The host side of the paged KV cache: which pages each episode holds, on which device, and who gets pages
when they run short.

Every block of rows (one per device along the mesh's data axes: `models.row_shards`) has a pool of
`pages_per_shard` pages of `page_size` slots. An owner (an episode, or a side branch forked from one) holds
pages of one shard, in slot order; pages are reference-counted, so a fork shares its parent's full pages and
takes a copy of its partial last page (copy on write). Pages return to the pool when their last owner lets go.
An episode and its forks are a family.

When pages run short nothing is dropped or overwritten: a grant that cannot be made is refused and the caller
holds the row back (a decode row sits out a chunk, an observation or a prompt waits a round). Deadlock is
impossible because every grant keeps enough pages free for the shard's oldest family to reach its largest
size (`reserve` pages: an episode at its longest and one side branch): that family always goes on, and when
it ends the pages it frees cover the next oldest (vLLM preempts instead, recomputing the evicted sequence;
holding a row back keeps its tokens and needs no recompute).

A GRPO group's responses are families of their own that share their prompt's full pages (`fork` with a
`family`): they start together, so their ages follow each other, and when the oldest of them ends its shared
pages stay with the next oldest, which counts them among its own: the argument above still holds.
"""
from __future__ import annotations

import dataclasses
from typing import Hashable, NamedTuple

import numpy as np

from searchrl.rollout.config import RolloutConfig


def reserve_pages(table_width: int, branches: bool) -> int:
    """Pages an episode holds at its largest (`PagePool`'s `reserve`): its row's `table_width` pages and, when
    its env runs a side branch, the branch's beside them (its shared pages plus a copied partial one)."""
    return table_width + (table_width + 1 if branches else 0)


def pool_pages(config: RolloutConfig, rows: int, shards: int, table_width: int, branches: bool) -> int:
    """Pages per device of a rollout on `rows` decode rows split into `shards` blocks: `config.pool_pages`,
    else enough for every decode and parked row of a block at its largest (`reserve_pages`; parked rows under
    either schedule: the same programs), so that no row ever waits for pages. The engine sizes its pool so,
    and `searchrl.benchmarks.aot` compiles it."""
    if config.pool_pages:
        return config.pool_pages
    return -(-(rows + config.parked_rows) // shards) * reserve_pages(table_width, branches)


class Forked(NamedTuple):
    """A fork's page to copy on device: (source, target) local ids, or None when it shares only full pages."""

    copy: tuple[int, int] | None


@dataclasses.dataclass
class _Holding:
    shard: int
    family: Hashable  # the episode of an owner and of its forks
    pages: list[int] = dataclasses.field(default_factory=list)


class PagePool:
    """Pages of `shards` pools of `pages_per_shard` pages each, `page_size` slots a page; a family may
    hold at most `reserve` distinct pages at once (its largest size: a row's slots, plus a side branch's)."""

    def __init__(self, shards: int, pages_per_shard: int, page_size: int, reserve: int):
        if pages_per_shard < reserve:
            raise ValueError(f"rollout.pool_pages={pages_per_shard} pages a device cannot hold one episode at "
                             f"its largest ({reserve} pages of {page_size} slots): raise it.")
        self.page_size, self.reserve = page_size, reserve
        self._free = [list(range(pages_per_shard - 1, -1, -1)) for _ in range(shards)]  # pop(): low ids first
        self._refs = np.zeros((shards, pages_per_shard), np.int32)
        self._owners: dict[Hashable, _Holding] = {}
        self._ages: dict[Hashable, int] = {}  # families holding pages, in the order they first took some
        self._next_age = 0

    @property
    def shards(self) -> int:
        return len(self._free)

    def pages(self, slots: int) -> int:
        """Pages that hold `slots` slots."""
        return -(-slots // self.page_size)

    def held(self, owner: Hashable) -> list[int]:
        """The local ids of `owner`'s pages, in slot order."""
        holding = self._owners.get(owner)
        return [] if holding is None else holding.pages

    def free(self, shard: int) -> int:
        return len(self._free[shard])

    def in_use(self) -> int:
        """Pages held by any owner, over every shard."""
        return int((self._refs > 0).sum())

    def _family_pages(self, family: Hashable) -> int:
        """Distinct pages a family holds."""
        return len({p for h in self._owners.values() if h.family == family for p in h.pages})

    def _headroom(self, shard: int, family: Hashable) -> int:
        """Pages of `shard` a member of `family` may take: all the free ones if it is (or would become) the
        shard's oldest family, else the free ones less what the oldest may still need."""
        others = {h.family for h in self._owners.values() if h.shard == shard and h.pages and h.family != family}
        if not others or (family in self._ages and self._ages[family] < min(self._ages[f] for f in others)):
            return self.free(shard)
        oldest = min(others, key=self._ages.__getitem__)
        return self.free(shard) - max(self.reserve - self._family_pages(oldest), 0)

    def _take(self, holding: _Holding, n: int) -> None:
        if n > 0 and holding.family not in self._ages:
            self._ages[holding.family], self._next_age = self._next_age, self._next_age + 1
        for _ in range(n):
            page = self._free[holding.shard].pop()
            self._refs[holding.shard, page] = 1
            holding.pages.append(page)

    def grow(self, owner: Hashable, shard: int, slots: int) -> bool:
        """Gives `owner` (of `shard`; its own family unless forked) the pages it needs to hold `slots` slots,
        if the shard can spare them (see the module docstring); returns whether it holds them now."""
        holding = self._owners.get(owner) or _Holding(shard, owner)
        if holding.shard != shard:
            raise ValueError(f"{owner!r} holds pages of device block {holding.shard}, not {shard}.")
        wanted = self.pages(slots) - len(holding.pages)
        if wanted > 0 and wanted > self._headroom(shard, holding.family):
            return False
        self._owners[owner] = holding
        self._take(holding, wanted)
        return True

    def fork(self, parent: Hashable, child: Hashable, slots: int, grow_to: int, family: Hashable | None = None
             ) -> Forked | None:
        """`child` (of `parent`'s family, or of a new `family`: an episode on its group's prompt) takes
        `parent`'s pages for its first `slots` slots, the full ones shared and a partial last one copied into
        a fresh page, and grows to hold `grow_to` slots; None (nothing taken) if the shard cannot spare the
        fresh pages. The caller copies `Forked.copy` on device (`generate.copy_pages`) after the parent wrote
        those slots and before either writes more."""
        if self.held(child):
            raise ValueError(f"{child!r} already holds pages.")
        source = self._owners[parent]
        family = source.family if family is None else family
        full = slots // self.page_size
        if self.pages(grow_to) - full > self._headroom(source.shard, family):
            return None
        shared = source.pages[:full]
        self._refs[source.shard, shared] += 1
        holding = self._owners[child] = _Holding(source.shard, family, list(shared))
        if family not in self._ages:  # younger than its parent, even if it takes no page of its own
            self._ages[family], self._next_age = self._next_age, self._next_age + 1
        copy = None
        if slots % self.page_size:
            self._take(holding, 1)
            copy = (source.pages[full], holding.pages[-1])
        self._take(holding, self.pages(grow_to) - len(holding.pages))
        return Forked(copy)

    def truncate(self, owner: Hashable, slots: int) -> None:
        """Lets go of `owner`'s pages past its first `slots` slots."""
        holding = self._owners.get(owner)
        if holding is not None:
            keep = self.pages(slots)
            self._let_go(holding, holding.pages[keep:])
            del holding.pages[keep:]

    def release(self, owner: Hashable) -> None:
        """Lets go of every page of `owner`."""
        holding = self._owners.pop(owner, None)
        if holding is not None:
            self._let_go(holding, holding.pages)
            if not any(h.family == holding.family for h in self._owners.values()):
                self._ages.pop(holding.family, None)

    def _let_go(self, holding: _Holding, pages: list[int]) -> None:
        for page in pages:
            self._refs[holding.shard, page] -= 1
            if self._refs[holding.shard, page] == 0:
                self._free[holding.shard].append(page)

    def table(self, owners: list[Hashable | None], width: int) -> np.ndarray:
        """The page tables [len(owners), width] int32 of a batch whose row r runs `owners[r]` (None: none);
        entries past an owner's pages name page 0 (never read: past the row's length)."""
        table = np.zeros((len(owners), width), np.int32)
        for r, owner in enumerate(owners):
            pages = self.held(owner) if owner is not None else []
            table[r, :len(pages)] = pages
        return table
