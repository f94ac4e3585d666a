"""A seeded retrieval world where users and documents name things differently: the DeepRetrieval miniature.

Two kinds of concept (conditions and treatments) each have a lay word, the one users write, and a technical
word, the one documents use, both invented syllable words. A topic pairs a condition with a treatment; its
relevant documents state both technical words among filler words (a few also use the condition's lay word),
while forum posts use the lay words and never the technical ones. So the user's own question ("which <lay
treatment> helps with <lay condition>") finds forum posts with BM25, and a rewrite into the technical words
finds the topic's documents.

Each concept also has `candidates`: its technical word among technical words of others of its kind, in random
order. A cold-started policy knows the candidates but not which one the corpus uses: learning that from the
retrieval reward alone is what RL has to do. Topics are split into train and held-out test topics; every
concept occurs in training, every test topic is a new combination.

Files (`write_world`), in BEIR layout: corpus.jsonl ({"_id", "title", "text"}), queries.jsonl ({"_id",
"text"}), qrels/{train,test}.tsv, and lexicon.json (the concepts, for analysis).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import random
from typing import Any

from searchrl.demo.synthetic import Namer

KINDS = ("condition", "treatment")
SPLITS = ("train", "test")
QUESTION_TEMPLATES = ("which {treatment} helps with {condition}", "{condition} treated by {treatment}",
                      "does {treatment} work for {condition}", "{treatment} against {condition}")


@dataclasses.dataclass(frozen=True)
class Concept:
    kind: str
    lay: str  # what users write
    technical: str  # what documents write
    candidates: tuple[str, ...]  # technical words a policy may consider for `lay` (`technical` among them)


@dataclasses.dataclass(frozen=True)
class RewriteWorld:
    seed: int
    concepts: dict[str, tuple[Concept, ...]]  # by kind
    docs: list[dict[str, str]]  # BEIR corpus rows
    queries: dict[str, list[dict[str, Any]]]  # by split: {"_id", "text", "qrels", "condition", "treatment"}

    def concept(self, lay: str) -> Concept:
        return next(c for kind in KINDS for c in self.concepts[kind] if c.lay == lay)


def _concepts(rng: random.Random, namer: Namer, kind: str, count: int, num_candidates: int
              ) -> tuple[Concept, ...]:
    lays = [namer.word().lower() for _ in range(count)]
    technical = [namer.word().lower() for _ in range(count)]
    out = []
    for i, (lay, tech) in enumerate(zip(lays, technical)):
        others = rng.sample([t for j, t in enumerate(technical) if j != i], num_candidates - 1)
        candidates = [tech, *others]
        rng.shuffle(candidates)
        out.append(Concept(kind, lay, tech, tuple(candidates)))
    return tuple(out)


def generate_world(seed: int, *, concepts_per_kind: int, num_candidates: int, docs_per_topic: int = 3,
                   posts_per_concept: int = 4, filler_words: int = 80, words_per_doc: int = 8,
                   lay_mention: float = 0.2, test_fraction: float = 0.25) -> RewriteWorld:
    """The world of one seed; see the module docstring. `concepts_per_kind` and `num_candidates` are the
    demo config's (`RewriteDemoConfig`)."""
    if not 2 <= num_candidates <= concepts_per_kind:
        raise ValueError(f"num_candidates must be in [2, concepts_per_kind], got {num_candidates}")
    rng = random.Random(seed)
    namer = Namer(rng)
    concepts = {kind: _concepts(rng, namer, kind, concepts_per_kind, num_candidates) for kind in KINDS}
    fillers = [namer.word().lower() for _ in range(filler_words)]

    def text(words: list[str]) -> str:
        words = words + rng.sample(fillers, words_per_doc - len(words))
        rng.shuffle(words)
        return " ".join(words)

    docs, topics = [], []
    for condition in concepts["condition"]:
        for treatment in concepts["treatment"]:
            relevant = []
            for _ in range(docs_per_topic):
                words = [condition.technical, treatment.technical]
                if rng.random() < lay_mention:
                    words.append(condition.lay)
                relevant.append(f"d{len(docs)}")
                docs.append({"_id": relevant[-1], "title": "", "text": text(words)})
            topics.append((condition, treatment, relevant))
    lays = [c.lay for kind in KINDS for c in concepts[kind]]
    for lay in lays:
        for _ in range(posts_per_concept):
            docs.append({"_id": f"d{len(docs)}", "title": "", "text": text([lay, rng.choice(lays)])})
    rng.shuffle(topics)
    num_test = round(test_fraction * len(topics))
    queries = {}
    for split, chosen in (("test", topics[:num_test]), ("train", topics[num_test:])):
        queries[split] = [{"_id": f"{split}{i}", "condition": c.lay, "treatment": t.lay,
                           "text": rng.choice(QUESTION_TEMPLATES).format(condition=c.lay, treatment=t.lay),
                           "qrels": {doc: 1 for doc in relevant}}
                          for i, (c, t, relevant) in enumerate(chosen)]
    trained = {q[kind] for q in queries["train"] for kind in KINDS}
    if missing := [lay for lay in lays if lay not in trained]:
        raise ValueError(f"concepts {missing} occur in no training topic: lower test_fraction")
    return RewriteWorld(seed, concepts, docs, queries)


def oracle_rewrite(world: RewriteWorld, query: dict[str, Any]) -> str:
    """The rewrite the corpus rewards: the technical words of the query's condition and treatment."""
    return f"{world.concept(query['condition']).technical} {world.concept(query['treatment']).technical}"


def candidate_rewrite(world: RewriteWorld, query: dict[str, Any], rng: random.Random) -> str:
    """A rewrite by a policy that knows each concept's candidates but not which is right: one drawn at
    random per concept (the cold start's training target)."""
    return " ".join(rng.choice(world.concept(query[kind]).candidates) for kind in KINDS)


def _write_jsonl(path: pathlib.Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_world(world: RewriteWorld, out_dir: str | pathlib.Path) -> dict[str, pathlib.Path]:
    """Writes the BEIR files and lexicon.json under `out_dir`; returns their paths."""
    out = pathlib.Path(out_dir)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    paths = {"corpus": out / "corpus.jsonl", "queries": out / "queries.jsonl",
             "lexicon": out / "lexicon.json"}
    _write_jsonl(paths["corpus"], world.docs)
    _write_jsonl(paths["queries"], [{"_id": q["_id"], "text": q["text"]}
                                    for split in SPLITS for q in world.queries[split]])
    for split in SPLITS:
        paths[split] = out / "qrels" / f"{split}.tsv"
        lines = [f"{q['_id']}\t{doc}\t{rel}\n"
                 for q in world.queries[split] for doc, rel in q["qrels"].items()]
        paths[split].write_text("query-id\tcorpus-id\tscore\n" + "".join(lines), encoding="utf-8")
    lexicon = {kind: [dataclasses.asdict(c) for c in world.concepts[kind]] for kind in KINDS}
    paths["lexicon"].write_text(json.dumps({"seed": world.seed, **lexicon}, indent=1) + "\n",
                                encoding="utf-8")
    return paths
