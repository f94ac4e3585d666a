"""The datasets a run trains and evaluates on: `config.data` and reading its files, one directory per dataset,
in one of FORMATS: QA (FlashRAG JSONL or Search-R1 parquet) or one of DeepRetrieval's retrieval task families
(`searchrl.data.retrieval_tasks`)."""
from __future__ import annotations

import dataclasses
import os

from searchrl.data import flashrag, retrieval_tasks

FORMATS = ("qa", "beir", "literature", "spider", "bird")
_TASK_FILES = {  # what each retrieval format reads under dir/<dataset>/
    "beir": ("queries.jsonl", "qrels/{split}.tsv"),
    "literature": ("{split}.jsonl",),
    "spider": ("{split}.json",),
    "bird": ("{split}.json",),
}


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """`config.data`: where the datasets are and which ones a run uses."""

    dir: str = ""  # qa: dir/<dataset>/{train,dev,test}.jsonl (or .parquet from Search-R1); others: see format
    train: str = "nq,hotpotqa"  # datasets mixed for training (Search-R1 trains on NQ + HotpotQA)
    train_split: str = "train"
    eval: str = "nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle"
    eval_split: str = "test"
    eval_limit: int = 0  # > 0: the first N questions of each eval set (quick looks)
    format: str = "qa"  # FORMATS = ("qa", "beir", "literature", "spider", "bird"); see load_examples


def dataset_path(directory: str, name: str, split: str) -> str:
    """directory/<name>/<split>.jsonl, or .parquet when that is what exists."""
    for ext in (".jsonl", ".parquet"):
        path = os.path.join(directory, name, split + ext)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"No {split}.jsonl or {split}.parquet for dataset {name!r} under {directory!r} "
                            f"(config.data.dir).")


def task_root(directory: str, name: str, split: str, format: str) -> str:
    """directory/<name>, once the files that a retrieval `format` reads for `split` are all there."""
    root = os.path.join(directory, name)
    files = [f.format(split=split) for f in _TASK_FILES[format]]
    missing = [f for f in files if not os.path.isfile(os.path.join(root, f))]
    if missing:
        raise FileNotFoundError(f"No {' and '.join(missing)} for {format} dataset {name!r} "
                                f"under {directory!r} (config.data.dir).")
    return root


def _read(directory: str, name: str, split: str, format: str) -> list:
    """The records of one dataset split in `format`."""
    if format == "qa":
        path = dataset_path(directory, name, split)
        return (flashrag.read_search_r1_parquet(path) if path.endswith(".parquet")
                else flashrag.read_flashrag_jsonl(path))
    root = task_root(directory, name, split, format)
    if format == "beir":
        return retrieval_tasks.read_beir_task(root, split)
    if format == "literature":
        return retrieval_tasks.read_literature_jsonl(os.path.join(root, f"{split}.jsonl"))
    return retrieval_tasks.read_sql_task(root, split, format)


def load_examples(directory: str, names: str, split: str, format: str = "qa") -> dict[str, list[dict]]:
    """Each named dataset's records (comma-separated names), tagged with their dataset name. `format` is the
    files' layout and the records' fields (see `searchrl.data.retrieval_tasks` for all but "qa")."""
    if format not in FORMATS:
        raise ValueError(f"unknown data format {format!r} (config.data.format); known: {', '.join(FORMATS)}")
    out = {}
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        out[name] = [{**r, "dataset": name} for r in _read(directory, name, split, format)]
    return out
