"""The flags every evaluation command line shares (`python -m searchrl.eval` and a task's own evaluations):
its config, which questions (datasets, split, limit), the rollout batch and the output directory."""
from __future__ import annotations

import dataclasses

from absl import flags
from ml_collections import config_flags


@dataclasses.dataclass(frozen=True)
class Selection:
    """The shared flags of one command line (absl FlagHolders: read `.value` after parsing)."""

    config: flags.FlagHolder
    datasets: flags.FlagHolder
    split: flags.FlagHolder
    limit: flags.FlagHolder
    batch_size: flags.FlagHolder
    out: flags.FlagHolder


def define(values: flags.FlagValues, out_help: str) -> Selection:
    """Defines the shared flags on a tool's `values` (`--config` required); `out_help` says where --out
    defaults to."""
    selection = Selection(
        config=config_flags.DEFINE_config_file("config", None, "Experiment config: configs/FILE.py:PRESET.",
                                               flag_values=values),
        datasets=flags.DEFINE_string("datasets", "", "Comma-separated dataset names (default: "
                                     "config.data.eval).", flag_values=values),
        split=flags.DEFINE_string("split", "", "Split to evaluate (default: config.data.eval_split).",
                                  flag_values=values),
        limit=flags.DEFINE_integer("limit", None, "First N questions per dataset (default: "
                                   "config.data.eval_limit; 0: all).", flag_values=values),
        batch_size=flags.DEFINE_integer("batch_size", 0, "Rollout rows per batch (default: "
                                        "config.train.batch_size).", flag_values=values),
        out=flags.DEFINE_string("out", "", f"Output directory (default: {out_help}).", flag_values=values))
    flags.mark_flag_as_required("config", flag_values=values)
    return selection
