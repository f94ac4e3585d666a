"""The QA datasets a run trains and evaluates on: `config.data` and reading its files (FlashRAG JSONL or
Search-R1 parquet, one directory per dataset)."""
from __future__ import annotations

import dataclasses
import os

from searchrl.data import flashrag


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """`config.data`: where the datasets are and which ones a run uses."""

    dir: str = ""  # FlashRAG layout: dir/<dataset>/{train,dev,test}.jsonl (or .parquet from Search-R1)
    train: str = "nq,hotpotqa"  # datasets mixed for training (Search-R1 trains on NQ + HotpotQA)
    train_split: str = "train"
    eval: str = "nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle"
    eval_split: str = "test"
    eval_limit: int = 0  # > 0: the first N questions of each eval set (quick looks)


def dataset_path(directory: str, name: str, split: str) -> str:
    """directory/<name>/<split>.jsonl, or .parquet when that is what exists."""
    for ext in (".jsonl", ".parquet"):
        path = os.path.join(directory, name, split + ext)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"No {split}.jsonl or {split}.parquet for dataset {name!r} under {directory!r} "
                            f"(config.data.dir).")


def load_examples(directory: str, names: str, split: str) -> dict[str, list[dict]]:
    """Each named dataset's records (comma-separated names), tagged with their dataset name."""
    out = {}
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        path = dataset_path(directory, name, split)
        records = (flashrag.read_search_r1_parquet(path) if path.endswith(".parquet")
                   else flashrag.read_flashrag_jsonl(path))
        out[name] = [{**r, "dataset": name} for r in records]
    return out
