"""The host's page pool: pages handed out by slots, shared by forks, taken back by reference count, and
grants that always leave the oldest episode room to finish (no deadlock, nothing dropped)."""
from __future__ import annotations

import numpy as np
import pytest

from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.pages import PagePool, pool_pages, reserve_pages


def test_the_pool_holds_every_row_at_its_largest_unless_sized():
    assert reserve_pages(10, branches=False) == 10
    assert reserve_pages(10, branches=True) == 21  # a side branch's table and its copied partial page
    # 12 decode rows and 2 parked ones over 4 devices: 4 rows a device (rounded up)
    assert pool_pages(RolloutConfig(parked_rows=2), 12, 4, 10, branches=True) == 4 * 21
    assert pool_pages(RolloutConfig(), 12, 4, 10, branches=False) == 3 * 10
    assert pool_pages(RolloutConfig(pool_pages=50), 12, 4, 10, branches=True) == 50


def test_pages_follow_slots_and_come_back_when_released():
    pool = PagePool(shards=2, pages_per_shard=8, page_size=4, reserve=4)
    assert pool.grow("a", 0, 5) and pool.held("a") == [0, 1]  # 5 slots: 2 pages, lowest ids first
    assert pool.grow("a", 0, 8) and pool.held("a") == [0, 1]  # still 2 pages
    assert pool.grow("b", 1, 1) and pool.held("b") == [0]  # another device's pool: its own ids
    assert (pool.free(0), pool.free(1), pool.in_use()) == (6, 7, 3)
    pool.truncate("a", 3)
    assert pool.held("a") == [0] and pool.free(0) == 7
    pool.release("a")
    assert pool.held("a") == [] and pool.free(0) == 8
    with pytest.raises(ValueError, match="device block 1, not 0"):
        pool.grow("b", 0, 9)


def test_grants_keep_the_oldest_owners_reserve():
    """A younger owner gets pages only while the oldest can still grow to `reserve` pages; the oldest gets
    every free page; when it ends, the next oldest's reserve is covered."""
    pool = PagePool(shards=1, pages_per_shard=10, page_size=1, reserve=6)
    assert pool.grow("old", 0, 2)  # first owner: the oldest; 8 free
    assert pool.grow("young", 0, 4)  # 8 free - 4 = 4 >= the oldest's 6 - 2 = 4 it may still need
    assert not pool.grow("young", 0, 5)  # one more would leave 3 < 4: refused, nothing taken
    assert pool.held("young") == [2, 3, 4, 5] and pool.free(0) == 4
    assert not pool.grow("new", 0, 1)  # a third owner neither
    assert pool.held("new") == []
    assert pool.grow("old", 0, 6)  # the oldest takes its reserve
    pool.release("old")
    assert pool.grow("young", 0, 6)  # now the oldest: up to the free pages
    with pytest.raises(ValueError, match="cannot hold one episode"):
        PagePool(shards=1, pages_per_shard=5, page_size=1, reserve=6)


def test_a_fork_shares_full_pages_and_copies_the_partial_one():
    pool = PagePool(shards=1, pages_per_shard=16, page_size=4, reserve=8)
    assert pool.grow("parent", 0, 10)  # pages 0, 1 full, page 2 holds slots 8, 9
    forked = pool.fork("parent", "child", 10, grow_to=17)
    assert forked.copy == (2, 3)  # the partial page copied into a fresh one
    assert pool.held("child") == [0, 1, 3, 4, 5]  # shares 0 and 1, then its own up to 17 slots
    assert pool.free(0) == 16 - 6
    pool.release("parent")
    assert pool.free(0) == 16 - 5  # page 2 freed; 0 and 1 still held by the child
    pool.release("child")
    assert pool.free(0) == 16
    assert pool.grow("parent", 0, 8)
    assert pool.fork("parent", "child", 8, grow_to=8).copy is None  # on a page boundary: nothing to copy
    assert pool.held("child") == pool.held("parent")
    with pytest.raises(ValueError, match="already holds"):
        pool.fork("parent", "child", 8, grow_to=8)


def test_a_fork_the_shard_cannot_spare_is_refused_whole():
    pool = PagePool(shards=1, pages_per_shard=8, page_size=2, reserve=6)
    assert pool.grow("old", 0, 4)  # 2 pages; it may need 4 more
    assert pool.grow("young", 0, 3)  # 2 pages: 4 free, all the oldest's
    free = pool.free(0)
    assert pool.fork("young", "branch", 3, grow_to=5) is None
    assert pool.held("branch") == [] and pool.free(0) == free


@pytest.mark.parametrize("seed", range(5))
def test_random_workloads_always_finish(seed):
    """Episodes of random lengths growing a few slots at a time on a pool of one episode's reserve and a
    bit: whatever the order of requests, some owner always gets its pages, every episode finishes, and every
    page comes back."""
    rng = np.random.default_rng(seed)
    reserve, page = 6, 4
    pool = PagePool(shards=1, pages_per_shard=reserve + 3, page_size=page, reserve=reserve)
    lengths = {e: int(rng.integers(1, reserve * page + 1)) for e in range(30)}
    size = {e: 0 for e in lengths}
    running, waiting, rounds = [], list(lengths), 0
    while running or waiting:
        rounds += 1
        assert rounds < 10_000, "no owner could go on"
        while waiting and len(running) < 4:
            running.append(waiting.pop(0))
        progressed = False
        for e in rng.permutation(running):
            want = min(size[e] + int(rng.integers(1, 5)), lengths[e])
            if pool.grow(e, 0, want):
                size[e], progressed = want, True
                if want == lengths[e]:
                    pool.release(e)
                    running.remove(e)
        assert progressed
    assert pool.in_use() == 0 and pool.free(0) == reserve + 3


def test_a_response_forked_into_a_family_of_its_own_shares_the_prompt_and_is_younger():
    pool = PagePool(shards=1, pages_per_shard=16, page_size=4, reserve=6)
    assert pool.grow("first", 0, 10)  # the prompt: pages 0, 1 full, 2 partial
    forked = pool.fork("first", "second", 10, grow_to=10, family="second")
    assert forked.copy == (2, 3) and pool.held("second") == [0, 1, 3]
    # "second" is a family of its own, younger than "first": its grant must leave "first" its reserve
    assert pool.grow("first", 0, 24)  # 6 pages, its reserve: nothing held back for it any more
    assert not pool.grow("second", 0, 16 * 4)
    assert pool.grow("second", 0, 24)
    pool.release("first")
    assert pool.held("second")[:2] == [0, 1] and pool.free(0) == 16 - 6


@pytest.mark.parametrize("seed", range(5))
def test_random_grpo_groups_sharing_their_prompt_always_finish(seed):
    """Groups of 3 responses, the first prefilling a prompt the other two fork (families of their own),
    growing in random order on a pool of one episode's reserve and a bit: every response finishes and every
    page comes back."""
    rng = np.random.default_rng(seed)
    reserve, page = 6, 4
    pool = PagePool(shards=1, pages_per_shard=reserve + 3, page_size=page, reserve=reserve)
    groups = [(int(rng.integers(1, 3 * page)), [int(rng.integers(3 * page, reserve * page + 1)) for _ in range(3)])
              for _ in range(10)]
    size, lengths, running, rounds = {}, {}, [], 0
    while groups or running:
        rounds += 1
        assert rounds < 10_000, "no owner could go on"
        if groups and len(running) < 4:
            prompt, ends = groups[0]
            first = (len(groups), 0)
            if pool.grow(first, 0, prompt):
                started = [first] + [(len(groups), k) for k in (1, 2)
                                     if pool.fork(first, (len(groups), k), prompt, prompt, family=(len(groups), k))]
                for e in started:
                    size[e], lengths[e] = prompt, ends[e[1]]
                running += started
                if len(started) == 3:
                    groups.pop(0)
                else:  # a group that could not fork every response gives its pages back and tries later
                    for e in started:
                        pool.release(e)
                        running.remove(e)
        progressed = False
        for i in rng.permutation(len(running)):
            e = running[i]
            want = min(size[e] + int(rng.integers(1, 5)), lengths[e])
            if pool.grow(e, 0, want):
                size[e], progressed = want, True
        for e in [e for e in running if size[e] == lengths[e]]:
            pool.release(e)
            running.remove(e)
        assert progressed or not running
    assert pool.in_use() == 0 and pool.free(0) == reserve + 3
