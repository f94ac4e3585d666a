"""A training run's progress on the console: step, reward, tokens/s, episodes/s, step time and ETA.

On a terminal the line is rewritten in place; elsewhere (SLURM, nohup, a pipe) a carriage return would pile
every update onto one line of the log, so a plain line is printed every `every_s` seconds and at the end.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Mapping, TextIO


def duration(seconds: float) -> str:
    """`seconds` as 45s, 3m05s or 2h07m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_line(step: int, total: int, metrics: Mapping[str, float], eta_s: float | None) -> str:
    """One step's progress: its number, mean reward, throughput (`perf/*` metrics) and the time left."""
    parts = [f"step {step}/{total}", f"reward {metrics['reward/mean']:.3f}"]
    if "perf/tokens_per_second" in metrics:
        parts += [f"{metrics['perf/tokens_per_second']:,.0f} tok/s",
                  f"{metrics['perf/episodes_per_second']:.2f} ep/s",
                  f"step {metrics['perf/step_seconds']:.1f}s"]
    if eta_s is not None:
        parts.append(f"ETA {duration(eta_s)}")
    return " | ".join(parts)


class Progress:
    """Prints `progress_line` after each step of a run going from step `initial` to `total`: in place on a
    terminal, else one line every `every_s` seconds (and the first and last steps'). The ETA is the time per step so
    far in this process (evaluations and checkpoints included) times the steps left."""

    def __init__(self, total: int, initial: int, every_s: float, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.initial, self.every_s = total, initial, every_s
        self.stream = sys.stdout if stream is None else stream
        self.tty = self.stream.isatty()
        self.clock = clock
        self.started = self.last_printed = clock()
        self.width = 0

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        now = self.clock()
        done = step - self.initial
        eta = (now - self.started) / done * (self.total - step) if done > 0 else None
        line = f"train {progress_line(step, self.total, metrics, eta)}"
        if self.tty:
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
        elif done == 1 or now - self.last_printed >= self.every_s or step >= self.total:
            self.stream.write(line + "\n")
            self.last_printed = now
        else:
            return
        self.stream.flush()

    def close(self) -> None:
        """Ends the in-place line on a terminal."""
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()
