"""What a multi-seed miniature writes: each policy's metrics averaged over the seeds, results.md and
results.json under its workdir."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import numpy as np


def seed_means(per_seed: Mapping[str, Mapping[str, Mapping[str, float]]], policies: Sequence[str],
               metrics: Sequence[str]) -> dict[str, dict[str, float]]:
    """policy -> metric -> its mean over the seeds' results."""
    return {policy: {m: float(np.mean([r[policy][m] for r in per_seed.values()])) for m in metrics}
            for policy in policies}


def write_results(workdir: str, table: str, results: Mapping[str, Any]) -> None:
    """Prints the Markdown `table`; writes it to workdir/results.md and `results` to workdir/results.json."""
    print(table)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
