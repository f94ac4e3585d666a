"""Run metrics to a JSONL file (one object per step, easy to read back) and, as `train.logger` asks,
TensorBoard event files (<workdir>/tensorboard) and a Weights & Biases run (its files under <workdir>/wandb)."""
from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Mapping, Sequence

import jax

log = logging.getLogger(__name__)


class _TensorBoard:
    def __init__(self, workdir: str, resume_step: int | None):
        from tensorboardX import SummaryWriter

        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=purge)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    """A W&B run named after the workdir; WANDB_MODE=offline keeps it on disk (`wandb sync` uploads it)."""

    def __init__(self, workdir: str, project: str | None, config: Mapping[str, Any] | None):
        try:
            import wandb
        except ImportError:
            raise RuntimeError("train.logger names wandb, which is not installed: pip install wandb (or the "
                               "project's `tracking` extra)") from None
        self.run = wandb.init(project=project, name=os.path.basename(os.path.normpath(workdir)), dir=workdir,
                              config=dict(config or {}))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MetricWriter:
    """Writes scalars from process 0 only; other processes get a no-op writer."""

    def __init__(self, workdir: str, enabled: bool | None = None, resume_step: int | None = None,
                 loggers: Sequence[str] = ("tensorboard",), project: str | None = None,
                 config: Mapping[str, Any] | None = None):
        """`resume_step`: the step a resumed run restarts from; the rows logged after it, which the run is
        about to log again, are dropped from the JSONL file and hidden in TensorBoard. `loggers`: some of
        "tensorboard" and "wandb" (others, e.g. "console", are not this writer's); `project` (None: W&B's
        default) and `config` (the run's, as a dict) go to W&B."""
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._sinks: list[_TensorBoard | _WandB] = []
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            if resume_step is not None and os.path.exists(self.path):
                drop_rows_after(self.path, resume_step)
            self._jsonl = open(self.path, "a", encoding="utf-8")
            if "tensorboard" in loggers:
                self._sinks.append(_TensorBoard(workdir, resume_step))
            if "wandb" in loggers:
                self._sinks.append(_WandB(workdir, project, config))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Appends one step's scalars (non-finite values are kept in JSONL as strings, never dropped)."""
        if not self.enabled:
            return
        values = {name: float(value) for name, value in metrics.items()}
        row = {"step": int(step)} | {k: v if math.isfinite(v) else str(v) for k, v in values.items()}
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        for sink in self._sinks:
            sink.write(int(step), values)

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            for sink in self._sinks:
                sink.close()


def read_metrics(path: str) -> list[dict]:
    """The rows a MetricWriter wrote, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


CORRUPT = ".corrupt"  # suffix of the file the damaged lines of a metrics file are set aside in


def parse_row(line: bytes) -> dict | None:
    """One metrics line as a row (a JSON object with an integer "step"), else None: not UTF-8, not JSON
    (torn by a crash), or edited by hand into something else."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, integers too long, nested too deep
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return row if isinstance(step, int) and not isinstance(step, bool) else None


def drop_rows_after(path: str, step: int) -> None:
    """Rewrites the JSONL file `path` without its rows past `step`, by an atomic replace: a crash leaves the
    old file or the new one. A damaged line (`parse_row`: a line torn by a crash, non-UTF-8 bytes, a row
    without "step") is not lost and does not stop the run: it is set aside, appended to `<path>.corrupt`,
    as unusable checkpoints are, and logged with its line number."""
    kept, damaged, numbers = [], [], []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row = parse_row(line)
            if row is None:
                damaged.append(line if line.endswith(b"\n") else line + b"\n")
                numbers.append(number)
            elif row["step"] <= step:
                kept.append(line.rstrip(b"\r\n") + b"\n")
    if damaged:
        with open(path + CORRUPT, "ab") as f:
            f.writelines(damaged)
            f.flush()
            os.fsync(f.fileno())
        where = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
        log.warning("%s: set aside %d damaged line(s) (lines %s) in %s", path, len(damaged), where,
                    path + CORRUPT)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
