"""`config.data`: where the datasets are and which ones a run uses (no reading here: building a config stays
instant)."""
from __future__ import annotations

from searchrl.configlib import group, ranged


@group
class DataConfig:
    """`config.data`: where the datasets are and which ones a run uses."""

    dir: str = ""  # qa: dir/<dataset>/{train,dev,test}.jsonl (or .parquet from Search-R1); others: see format
    train: str = "nq,hotpotqa"  # datasets mixed for training (Search-R1 trains on NQ + HotpotQA)
    train_split: str = "train"
    eval: str = "nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle"
    eval_split: str = "test"
    eval_limit: int = ranged(0, "[0, inf)")  # > 0: the first N questions of each eval set (quick looks)
    format: str = "qa"  # a name in searchrl.data.datasets.FORMATS
    tfds_dir: str = ""  # where the datasets are prepared for reading (TFDS ArrayRecord); "": <dir>/.tfds
