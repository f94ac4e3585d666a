"""Synthetic world: determinism, answers supported by the passages, the entity split, BM25 retrieval of every
plan query, reader compatibility, and scale."""
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
import Stemmer
from tokenizers import Regex, pre_tokenizers

from searchrl.data import read_flashrag_jsonl
from searchrl.demo.synthetic import (DISTRACTOR, NAME_SYLLABLES, ORG_SUFFIXES, RELATIONS, SPLITS,
                                     TYPE_RELATIONS, generate_world, write_world)
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.corpus import CorpusStore
from searchrl.text.tokenizer import load_tokenizer, train_bpe_tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]
FILES = ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "world.json")


@pytest.fixture(scope="module")
def world():
    return generate_world(0, 400)


@pytest.fixture(scope="module")
def paths(world, tmp_path_factory):
    return write_world(world, tmp_path_factory.mktemp("world"))


def _questions(world):
    return [q for split in SPLITS for q in world.questions[split]]


def _read(directory):
    return {name: (pathlib.Path(directory) / name).read_bytes() for name in FILES}


def test_same_seed_same_bytes_across_processes(tmp_path):
    """The CLI in a fresh process (another hash seed) writes the bytes write_world writes here."""
    write_world(generate_world(7, 120, questions_per_entity=2.0), tmp_path / "api")
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "searchrl.demo.synthetic", "--out", str(tmp_path / "cli"), "--seed", "7",
               "--entities", "120", "--questions-per-entity", "2"]
    subprocess.run(command, check=True, env=env, cwd=REPO, capture_output=True)
    assert _read(tmp_path / "api") == _read(tmp_path / "cli")


def test_other_seed_other_world(tmp_path):
    write_world(generate_world(1, 120), tmp_path / "a")
    write_world(generate_world(2, 120), tmp_path / "b")
    a, b = _read(tmp_path / "a"), _read(tmp_path / "b")
    assert all(a[name] != b[name] for name in FILES)


def test_readers_accept_the_files(world, paths, tmp_path):
    store = CorpusStore.build(paths["corpus"], tmp_path / "store", show_progress=False)
    assert len(store) == len(world.passages) >= 1000
    for i in (0, len(store) // 2, len(store) - 1):
        p = world.passages[i]
        assert store[i] == (p.id, f'"{p.title}"', p.text)  # the stored title line, quotes and all
        assert store.hit(i, 0.0).contents == p.to_json()["contents"]
    for split in SPLITS:
        assert read_flashrag_jsonl(paths[split]) == world.questions[split]


def test_bridge_answers_follow_the_world(world):
    """Walking the subject's attributes along the relations gives every hop answer; each hop's supporting
    passage belongs to the hop's entity, states the relation, contains the plan query's words and the answer;
    a later hop's query starts with the previous hop's answer."""
    passages = {p.id: p for p in world.passages}
    bridges = [q for q in _questions(world) if q["metadata"]["type"] == "bridge"]
    assert {q["metadata"]["hops"] for q in bridges} == {1, 2, 3}
    for q in bridges:
        meta = q["metadata"]
        assert meta["hops"] == len(meta["supporting_ids"]) == len(meta["plan"]) == len(meta["relations"])
        node = world.entities[meta["subjects"][0]]
        assert node.name in q["question"]
        visited = [node.id]
        for hop, (name, pid, query, answer) in enumerate(zip(meta["relations"], meta["supporting_ids"],
                                                              meta["plan"], meta["hop_answers"])):
            rel, passage = RELATIONS[name], passages[pid]
            assert (passage.entity, name in passage.relations) == (node.id, True)
            assert query == f"{node.name} {rel.keyword}"
            if hop:
                assert query.startswith(meta["hop_answers"][hop - 1])
            assert all(word in f"{passage.title} {passage.text}" for word in query.split())
            value = node.attributes[name]
            if rel.target is not None:
                node = world.entities[value]
                assert node.name == answer and node.id not in visited
                visited.append(node.id)
            else:
                assert str(value) == answer
            assert answer in passage.text
        assert q["golden_answers"] == [meta["hop_answers"][-1]]


def test_comparison_answers_follow_the_world(world):
    passages = {p.id: p for p in world.passages}
    comparisons = [q for q in _questions(world) if q["metadata"]["type"] == "comparison"]
    assert comparisons
    for q in comparisons:
        meta = q["metadata"]
        a, b = (world.entities[s] for s in meta["subjects"])
        relation = "birth_year" if a.type == "person" else "founding_year"
        assert a.type == b.type and meta["hops"] == 2 and meta["relations"] == [relation] * 2
        assert f"{a.name} or {b.name}" in q["question"]
        year_a, year_b = a.attributes[relation], b.attributes[relation]
        earlier, later = (a, b) if year_a < year_b else (b, a)
        assert q["golden_answers"] == [(earlier if "earlier" in q["question"] else later).name]
        assert meta["hop_answers"] == [str(year_a), str(year_b)]
        for entity, pid, year in zip((a, b), meta["supporting_ids"], (year_a, year_b)):
            assert passages[pid].entity == entity.id and str(year) in passages[pid].text
        assert any(q["golden_answers"][0] in passages[pid].text for pid in meta["supporting_ids"])


def test_split_by_subject(world):
    subjects = {split: {s for q in world.questions[split] for s in q["metadata"]["subjects"]}
                for split in SPLITS}
    assert all(subjects.values())
    assert not subjects["train"] & (subjects["dev"] | subjects["test"])
    assert not subjects["dev"] & subjects["test"]
    for split in SPLITS:
        assert {world.entities[s].split for s in subjects[split]} == {split}
    summary = world.summary()["splits"]
    assert [summary[s]["questions"] for s in SPLITS] == [len(world.questions[s]) for s in SPLITS]
    assert len({q["question"] for q in _questions(world)}) == len(_questions(world))


def test_passages_state_each_fact_once(world):
    stated = [(p.entity, r) for p in world.passages for r in p.relations]
    expected = [(e.id, r.name) for e in world.entities.values() for r in TYPE_RELATIONS[e.type]]
    assert sorted(stated) == sorted(expected)
    assert {len(p.relations) for p in world.passages} == {1, 2}
    assert max(len(f"{p.title} {p.text}".split()) for p in world.passages) <= 25
    row = world.passages[0].to_json()
    assert row["contents"] == f'"{world.passages[0].title}"\n{world.passages[0].text}'
    assert row["id"] == world.passages[0].id == "0"


def test_names_are_distinct_bm25_terms(world):
    """No two entities share a name or its word set, stemming keeps every name word whole, and every
    distractor is a near-duplicate of a question-bearing entity (a shared word or one vowel apart)."""
    names = [e.name for e in world.entities.values()]
    assert len({frozenset(n.lower().split()) for n in names}) == len(names)
    words = sorted({w.lower() for n in names for w in n.split()})
    stems = Stemmer.Stemmer("english").stemWords(words)
    assert len(set(stems)) == len(words)
    syllable_words = [w for w in words if w.capitalize() not in ORG_SUFFIXES]
    assert Stemmer.Stemmer("english").stemWords(syllable_words) == syllable_words
    real = [e for e in world.entities.values() if e.split != DISTRACTOR]
    twins = [e for e in world.entities.values() if e.split == DISTRACTOR]
    assert len(twins) >= 0.2 * len(real)

    def near(a, b):
        if " " in a:
            return bool(set(a.split()) & set(b.split()))
        return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1

    for twin in twins:
        assert any(e.type == twin.type and near(twin.name, e.name) for e in real), twin.name


def test_plan_queries_retrieve_supporting_passage_first(world, paths, tmp_path):
    retriever = BM25Retriever.build(paths["corpus"], tmp_path / "bm25", show_progress=False, n_threads=0)
    queries, gold = [], []
    for q in _questions(world):
        queries += q["metadata"]["plan"]
        gold += q["metadata"]["supporting_ids"]
    hits = retriever.search(queries, k=1)
    rate = sum(bool(h) and h[0].id == g for h, g in zip(hits, gold)) / len(gold)
    print(f"BM25 rank-1 rate of plan queries: {rate:.4f} over {len(gold)} hops")
    assert rate >= 0.95


@pytest.mark.parametrize("fractions, comparison, kinds", [
    ((1, 0, 0), 0.3, {"1-hop bridge"}),
    ((0, 1, 0), 1.0, {"2-hop comparison"}),
    ((0, 1, 0), 0.0, {"2-hop bridge"}),
    ((0, 0, 1), 0.3, {"3-hop bridge"}),
])
def test_hop_mix_is_controlled(fractions, comparison, kinds):
    world = generate_world(3, 200, hop_fractions=fractions, comparison_fraction=comparison)
    summary = world.summary()["splits"]
    for split in SPLITS:
        assert set(summary[split]) - {"questions", "subjects"} == kinds
        assert summary[split]["questions"] == len([e for e in world.entities.values() if e.split == split])


def test_balanced_default_mix():
    world = generate_world(4, 600, questions_per_entity=2.0)
    train = world.summary()["splits"]["train"]
    assert train["questions"] == 2 * 480
    assert train["1-hop bridge"] == train["3-hop bridge"] == 320
    assert (train["2-hop bridge"], train["2-hop comparison"]) == (224, 96)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_entities=5), "num_entities must be >= 8"),
    (dict(hop_fractions=(1, 1)), "hop_fractions must be 3 non-negative shares"),
    (dict(hop_fractions=(0, 0, 0)), "hop_fractions"),
    (dict(comparison_fraction=1.5), "comparison_fraction must be in"),
    (dict(dev_fraction=0.5, test_fraction=0.5), "dev_fraction \\+ test_fraction must be < 1"),
    (dict(questions_per_entity=-1), "questions_per_entity must be >= 0"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_world(0, **{"num_entities": 100, **kwargs})


@pytest.mark.parametrize("num_entities, persons", [(8, 4), (34, 17), (38, 19)])
def test_small_worlds(num_entities, persons):
    world = generate_world(0, num_entities)
    assert world.summary()["entities"]["person"] == persons
    assert world.questions["train"]


def test_hundred_thousand_passages(tmp_path):
    start = time.perf_counter()
    world = generate_world(0, 32_000)
    generated = time.perf_counter() - start
    write_world(world, tmp_path)
    print(f"{len(world.passages)} passages: generated in {generated:.1f} s, "
          f"written in {time.perf_counter() - start - generated:.1f} s")
    assert len(world.passages) >= 100_000
    assert sum(1 for _ in open(tmp_path / "corpus.jsonl", encoding="utf-8")) == len(world.passages)


def test_demo_tokenizer_cuts_names_into_syllables(world, tmp_path):
    """With `NAME_SYLLABLES`, every token of a name word lies within one syllable (the first syllable keeps
    its leading space), other words tokenize as without it, and decoding gives the text back."""
    split = pre_tokenizers.Split(Regex(NAME_SYLLABLES), behavior="isolated")
    assert [p for p, _ in split.pre_tokenize_str(" Hirtho Mavon's father, Nisstok Zerorkran; The Guild")] == [
        " Hir", "tho", " Ma", "von", "'s father, Nis", "stok", " Ze", "ror", "kran", "; The Guild"]
    texts = [p.to_json()["contents"] for p in world.passages]
    train_bpe_tokenizer(texts, 600, out_dir=tmp_path, split_pattern=NAME_SYLLABLES)
    tokenizer = load_tokenizer(str(tmp_path))  # as the demo reads it back
    syllable = re.compile(r" ?(?:[bdfghklmnprstvz]|br|dr|kr|st|th)[aeiou](?:[rlnsmk]|th)?", re.IGNORECASE)
    for entity in world.entities.values():
        for word in entity.name.split():
            if word in ORG_SUFFIXES:
                continue
            pieces = [p for p, _ in split.pre_tokenize_str(" " + word)]
            assert "".join(pieces) == " " + word and all(syllable.fullmatch(p) for p in pieces)
            tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode(" " + word))
            ends = {len("".join(pieces[: i + 1])) for i in range(len(pieces))}
            spans = [len("".join(t.replace("Ġ", " ") for t in tokens[: i + 1])) for i in range(len(tokens))]
            assert ends <= set(spans), (word, tokens)
    plain = train_bpe_tokenizer(texts, 600)
    sentence = "The Guild was founded in 1901."
    assert tokenizer.tokenize(sentence) == plain.tokenize(sentence)
    assert all(tokenizer.decode(tokenizer.encode(t)) == t for t in texts[:200])
