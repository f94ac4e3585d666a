"""Packing a rollout batch's sequences into rows for the learn step, on the host (numpy).

The trainer pads each rollout batch to B rows of its width S; a short row then costs as much as the longest.
`pack` lays out the sequences the way `ppo.learn` runs them instead: for every epoch, minibatch and
micro-batch of the update (the minibatches hold the rows `orders` gives, as the padded update would), the
micro-batch's sequences are packed whole, first-fit-decreasing, into `rows` rows of width S, at most
`sequences` of them per micro-batch. The scoring pass runs on the first epoch's micro-batches (each
sequence once). Shapes are static for a step: [E, M, K, ...] for E epochs, M minibatches and K micro-batches
per minibatch, K the most any minibatch needs (empty micro-batches and slots hold no sequence). K is at most
ceil(minibatch_size / min(rows, sequences)) (one sequence a row), so a run compiles a bounded set of programs.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Packing(NamedTuple):
    """Where every sequence of a [B, S] batch sits in the packed layout, per epoch, minibatch and micro-batch.

    A packed slot holds the token at flat index `sources` (row * S + slot) of the batch, or none (B * S); a
    packed row's sequences are told apart by their batch row (`sources // S`), and a token's position is its
    slot (`sources % S`)."""

    sequences: np.ndarray  # int32 [E, M, K, Q]: the batch row of each sequence slot (B: empty)
    starts: np.ndarray  # int32 [E, M, K, Q]: its first slot in the micro-batch's flattened [rows, S]
    sources: np.ndarray  # int32 [E, M, K, rows, S]: the batch slot each packed slot holds (B * S: none)

    @property
    def micro_batches(self) -> int:
        """K, the micro-batches of every minibatch (the step's static packed size)."""
        return self.sources.shape[2]


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


def pack(lengths: np.ndarray, orders: np.ndarray, minibatch_size: int, sequences: int, rows: int,
         width: int) -> Packing:
    """The packed layout (`Packing`) of a batch whose row b holds `lengths[b]` tokens (a prefix of its
    `width` slots), updated in `orders` [E, B] (each epoch's rows, minibatch after minibatch)."""
    lengths = np.asarray(lengths, np.int64)
    batch = lengths.size
    if lengths.max(initial=0) > width:
        raise ValueError(f"a row of {lengths.max()} tokens does not fit in packed rows of {width}")
    epochs = np.asarray(orders).reshape(len(orders), -1, minibatch_size)
    plans = [[_micro_batches(mb, lengths, width, rows, sequences) for mb in epoch] for epoch in epochs]
    k = max(len(plan) for epoch in plans for plan in epoch)
    shape = (*epochs.shape[:2], k)
    seqs, starts = np.full(shape + (sequences,), batch, np.int32), np.zeros(shape + (sequences,), np.int32)
    sources = np.full(shape + (rows, width), batch * width, np.int32)
    for e, epoch in enumerate(plans):
        for m, plan in enumerate(epoch):
            for i, micro in enumerate(plan):
                for q, (b, r, offset) in enumerate(micro):
                    seqs[e, m, i, q], starts[e, m, i, q] = b, r * width + offset
                    sources[e, m, i, r, offset:offset + lengths[b]] = b * width + np.arange(lengths[b])
    return Packing(seqs, starts, sources)

