"""Packing a rollout batch's sequences into rows for the learn step, on the host (numpy).

The trainer pads each rollout batch to B rows of its width S; a short row then costs as much as the longest.
`pack` lays out the sequences the way `ppo.learn` runs them instead: for every epoch, minibatch and
micro-batch of the update (the minibatches hold the rows `orders` gives, as the padded update would), the
micro-batch's sequences are packed whole, first-fit-decreasing, into `rows` rows of width W = S (with block
pairs, below: of the one of a few widths W >= S, `WIDENINGS`, that takes the fewest slots), at most
`sequences` of them per micro-batch. The scoring pass runs on the first epoch's micro-batches (each
sequence once). Shapes are static for a step: [E, M, K, ...] for E epochs, M minibatches and K micro-batches
per minibatch, K the most any minibatch needs (empty micro-batches and slots hold no sequence). K is at most
ceil(minibatch_size / min(rows, sequences)) (one sequence a row) and W one of five widths, so a run compiles a
bounded set of programs.

With a `block` size, every packed row also lists the pairs of (query block, key block) that hold a visible
pair of its tokens (`models.visible_block_pairs`), for attention that computes only those (`models.Segments`).
Their number P is the most any row has, rounded up to a multiple of the row's blocks (a bounded set again).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from searchrl.models.attention_base import round_up, visible_block_pairs


# Packed rows may be wider than the batch's: `pack` tries its width and these sixteenths of it (in multiples
# of ALIGN slots) and keeps the layout with the fewest slots. A minibatch takes whole micro-batches of `rows`
# rows each, so a row a little wider often saves a last, mostly empty micro-batch: on 8 shards of a
# Search-R1-like mix, up to 7% of the slots (`benchmarks.padding`). Only with block pairs: attention then
# computes nothing across sequences, so wider rows cost no more than their slots.
WIDENINGS = (16, 17, 18, 19, 20)
ALIGN = 128


class Packing(NamedTuple):
    """Where every sequence of a [B, S] batch sits in the packed layout, per epoch, minibatch and micro-batch.

    A packed slot holds the token at flat index `sources` (row * S + slot) of the batch, or none (B * S); a
    packed row's sequences are told apart by their batch row (`sources // S`), and a token's position is its
    slot (`sources % S`)."""

    sequences: np.ndarray  # int32 [E, M, K, Q]: the batch row of each sequence slot (B: empty)
    starts: np.ndarray  # int32 [E, M, K, Q]: its first slot in the micro-batch's flattened [rows, W]
    sources: np.ndarray  # int32 [E, M, K, rows, W]: the batch slot each packed slot holds (B * S: none)
    # int32 [E, M, K, rows, P, 2]: each packed row's (query block, key block) pairs, then (-1, -1); P = 0
    # without a block size
    block_pairs: np.ndarray

    @property
    def micro_batches(self) -> int:
        """K, the micro-batches of every minibatch (the step's static packed size)."""
        return self.sources.shape[2]

    @property
    def width(self) -> int:
        """W, the packed rows' width."""
        return self.sources.shape[-1]


def _micro_batches(rows_of: np.ndarray, lengths: np.ndarray, width: int, rows: int, sequences: int
                   ) -> list[list[tuple[int, int, int]]]:
    """The rows `rows_of` of one minibatch first-fit-decreasing into packed rows of `width`, `rows` packed
    rows and at most `sequences` sequences a micro-batch: per micro-batch, (batch row, packed row, offset)."""
    fill = np.zeros(0, np.int64)  # tokens in each packed row so far; row r is in micro-batch r // rows
    count: list[int] = []  # sequences in each micro-batch
    placed: list[list[tuple[int, int, int]]] = []
    for b in sorted(rows_of.tolist(), key=lambda b: -lengths[b]):
        fits = (fill + lengths[b] <= width) & (np.asarray(count)[np.arange(fill.size) // rows] < sequences)
        if fits.any():
            r = int(np.argmax(fits))
        else:  # a new row, in a new micro-batch if the last one is full
            r = fill.size if fill.size % rows and count[-1] < sequences else len(count) * rows
            fill = np.concatenate([fill, np.zeros(r + 1 - fill.size, np.int64)])
            if r // rows == len(count):
                count.append(0)
                placed.append([])
        placed[r // rows].append((b, r % rows, int(fill[r])))
        fill[r] += lengths[b]
        count[r // rows] += 1
    return placed


def _block_pairs(sources: np.ndarray, width: int, empty: int, block: int) -> np.ndarray:
    """The packed rows' block pairs [..., P, 2] (module docstring) from their `sources` [..., rows, W] of a
    batch of `width` slots a row."""
    flat = sources.reshape(-1, sources.shape[-1])
    pairs = visible_block_pairs(flat // width, flat != empty, block, multiple=-(-flat.shape[1] // block))
    return pairs.reshape(*sources.shape[:-1], *pairs.shape[1:])


def packed_widths(width: int, block: int, max_width: int | None = None) -> list[int]:
    """The packed widths `pack` tries for a batch of `width` slots a row: `width`, and with block pairs of
    `block` slots (0: none) `WIDENINGS` sixteenths of it in multiples of `ALIGN` up to `max_width`. Without
    block pairs `width` alone: attention that computes every pair of a row would pay for a wider one."""
    wider = {round_up(width * n // 16, ALIGN) for n in WIDENINGS} if block else set()
    return sorted({width} | {w for w in wider if width <= w <= (max_width or w)})


def pack(lengths: np.ndarray, orders: np.ndarray, minibatch_size: int, sequences: int, rows: int,
         width: int, block: int = 0, widths: Sequence[int] | None = None) -> Packing:
    """The packed layout (`Packing`) of a batch whose row b holds `lengths[b]` tokens (a prefix of its
    `width` slots), updated in `orders` [E, B] (each epoch's rows, minibatch after minibatch), in packed rows
    of the one of `widths` (default `packed_widths(width, block)`) that takes the fewest slots; with `block`,
    its rows' block pairs of `block` slots."""
    lengths = np.asarray(lengths, np.int64)
    batch = lengths.size
    widths = widths or packed_widths(width, block)
    if lengths.max(initial=0) > min(widths):
        raise ValueError(f"a row of {lengths.max()} tokens does not fit in packed rows of {min(widths)}")
    epochs = np.asarray(orders).reshape(len(orders), -1, minibatch_size)
    layouts = []
    for packed_width in widths:
        plans = [[_micro_batches(mb, lengths, packed_width, rows, sequences) for mb in epoch]
                 for epoch in epochs]
        k = max(len(plan) for epoch in plans for plan in epoch)
        layouts.append((k * packed_width, packed_width, plans, k))
    _, packed_width, plans, k = min(layouts, key=lambda layout: layout[:2])
    shape = (*epochs.shape[:2], k)
    seqs, starts = np.full(shape + (sequences,), batch, np.int32), np.zeros(shape + (sequences,), np.int32)
    sources = np.full(shape + (rows, packed_width), batch * width, np.int32)
    for e, epoch in enumerate(plans):
        for m, plan in enumerate(epoch):
            for i, micro in enumerate(plan):
                for q, (b, r, offset) in enumerate(micro):
                    seqs[e, m, i, q], starts[e, m, i, q] = b, r * packed_width + offset
                    sources[e, m, i, r, offset:offset + lengths[b]] = b * width + np.arange(lengths[b])
    pairs = (_block_pairs(sources, width, batch * width, block) if block
             else np.zeros((*sources.shape[:-1], 0, 2), np.int32))
    return Packing(seqs, starts, sources, pairs)
