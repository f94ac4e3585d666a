"""Static shapes: pad variable lengths to a few widths, so that jitted code compiles a bounded number of programs."""
from __future__ import annotations

from typing import Any, Sequence


def padded_width(length: int, max_len: int, buckets: int = 4) -> int:
    """The smallest of `buckets` evenly spaced widths up to `max_len` that holds `length`."""
    if not 0 <= length <= max_len:
        raise ValueError(f"length {length} is outside 0..{max_len}")
    quantum = -(-max_len // buckets)
    return min(max(-(-length // quantum), 1) * quantum, max_len)


def padded_batch(rows: Sequence[Any], batch_size: int) -> list[Any]:
    """`rows` padded to `batch_size` by repeating the last (a batch of one static shape)."""
    return list(rows) + [rows[-1]] * (batch_size - len(rows))
