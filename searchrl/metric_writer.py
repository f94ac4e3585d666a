"""Run metrics to a JSONL file (one object per step, easy to read back) and TensorBoard event files."""
from __future__ import annotations

import json
import math
import os
from typing import Mapping

import jax
from tensorboardX import SummaryWriter


class MetricWriter:
    """Writes scalars from process 0 only; other processes get a no-op writer."""

    def __init__(self, workdir: str, enabled: bool | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            self._jsonl = open(self.path, "a", encoding="utf-8")
            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Appends one step's scalars (non-finite values are kept in JSONL as strings, never dropped)."""
        if not self.enabled:
            return
        row = {"step": int(step)}
        for name, value in metrics.items():
            value = float(value)
            row[name] = value if math.isfinite(value) else str(value)
            self._tb.add_scalar(name, value, int(step))
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


def read_metrics(path: str) -> list[dict]:
    """The rows a MetricWriter wrote, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
