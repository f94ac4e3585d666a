"""A seeded fictional world for search-agent training, whose questions cannot be answered from memory.

Entities (persons, cities, organisations, countries) get syllable names and random functional facts
(birthplace, employer, headquarters, ...). Each fact is stated in exactly one short templated passage of its
subject, always with the relation's keyword ("birthplace"), so the query "<name> <keyword>" finds it as the
BM25 top hit. Questions chain facts (1-3 hop bridges: "Where was the founder of Velo Guild born?") or compare
two years (2-hop comparisons); each carries the `plan` of queries and the passages answering it. Questions are
split by subject: a dev/test subject is never a train subject. Distractor entities (near-duplicate names,
half their facts shared with the original) only add passages, so retrieval has to be precise.

Files (`write_world`): corpus.jsonl (FlashRAG: {"id", "contents": "\\"Title\\"\\ntext"}), train/dev/test.jsonl
(FlashRAG QA: {"id", "question", "golden_answers", "metadata"}) and world.json (entities, for analysis).

    python -m searchrl.demo.synthetic --out DIR --seed 0 --entities 1000
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import random
import time
from typing import Any, Iterable, Iterator, Sequence

from absl import app, flags

from searchrl import cli

ENTITY_TYPES = ("person", "city", "organisation", "country")
TYPE_SHARES = {"person": 0.5, "city": 0.2, "organisation": 0.2, "country": 0.1}
# How a passage's second fact names its subject: words that are no relation keyword.
REFERENCES = {"person": "this person", "city": "this city", "organisation": "this organisation",
              "country": "this nation"}
SPLITS = ("train", "dev", "test")
DISTRACTOR = "distractor"  # the split of entities that are never question subjects
MAX_HOPS = 3

# Every variant adds only the keyword to the name and the value, so the passages of one entity differ in BM25
# terms by their keyword alone ("is", "of", "the", "in" are stopwords; "'s" is dropped by the tokenizer).
GENERIC_FACTS = ("The {k} of {s} is {v}.", "{s}'s {k} is {v}.", "{v} is the {k} of {s}.")


@dataclasses.dataclass(frozen=True)
class Relation:
    """A functional fact of the `subjects` types: its value is an entity of type `target`, or a literal when
    `target` is None. `keyword` is written in every passage stating the fact and ends the query finding it;
    `phrase` names the value inside a longer question ("the birthplace of {x}")."""

    name: str
    subjects: tuple[str, ...]
    target: str | None
    keyword: str
    questions: tuple[str, ...]
    phrase: str = ""
    facts: tuple[str, ...] = GENERIC_FACTS


RELATIONS = {r.name: r for r in (
    Relation("birth_year", ("person",), None, "birth year",
             ("When was {x} born?", "In which year was {x} born?")),
    Relation("birthplace", ("person",), "city", "birthplace",
             ("Where was {x} born?", "What is the birthplace of {x}?"), "the birthplace of {x}"),
    Relation("occupation", ("person",), None, "occupation",
             ("What was the occupation of {x}?", "What did {x} do for a living?"), facts=GENERIC_FACTS[:2]),
    Relation("employer", ("person",), "organisation", "employer",
             ("Who was the employer of {x}?", "Which organisation employed {x}?"), "the employer of {x}"),
    Relation("country", ("city",), "country", "country",
             ("In which country is {x}?", "What is the country of {x}?"), "the country of {x}"),
    Relation("headquarters", ("organisation",), "city", "headquarters",
             ("Where is the headquarters of {x}?", "In which city is {x} headquartered?"),
             "the headquarters of {x}",
             ("The {k} of {s} is in {v}.", "{s}'s {k} is in {v}.", "{v} is the {k} of {s}.")),
    Relation("founder", ("organisation",), "person", "founder",
             ("Who founded {x}?", "Who is the founder of {x}?"), "the founder of {x}"),
    Relation("industry", ("organisation",), None, "industry",
             ("What is the industry of {x}?", "In which industry is {x}?"),
             facts=GENERIC_FACTS[:2] + ("{s} is in the {v} {k}.",)),
    Relation("capital", ("country",), "city", "capital",
             ("What is the capital of {x}?", "Which city is the capital of {x}?"), "the capital of {x}"),
    Relation("founding_year", ("city", "organisation", "country"), None, "founding year",
             ("When was {x} founded?", "In which year was {x} founded?")),
)}
TYPE_RELATIONS = {t: tuple(r for r in RELATIONS.values() if t in r.subjects) for t in ENTITY_TYPES}
YEAR_RELATION = {t: "birth_year" if t == "person" else "founding_year" for t in ENTITY_TYPES}
YEAR_RANGES = {"person": (1700, 1980), "city": (600, 1800), "organisation": (1750, 1990),
               "country": (800, 1900)}
COMPARISONS = {"birth_year": "Who was born {order}, {a} or {b}?",
               "founding_year": "Which {noun} was founded {order}, {a} or {b}?"}
LITERALS = {
    "occupation": ("painter", "sculptor", "engineer", "botanist", "cartographer", "astronomer", "chemist",
                   "poet", "architect", "physician", "historian", "linguist", "composer", "mathematician",
                   "geologist", "weaver", "shipwright", "glassblower", "novelist", "surveyor"),
    "industry": ("shipbuilding", "textiles", "mining", "publishing", "brewing", "banking", "printing",
                 "pottery", "clockmaking", "forestry", "fishing", "railways", "glassmaking", "milling",
                 "tanning", "shipping"),
}
ORG_SUFFIXES = ("Guild", "Press", "Institute", "Society", "Trust", "Company", "Foundry", "Syndicate")

# Words: 2-3 syllables, each with a consonant onset. The last syllable's vowel (a/o/u) and coda are chosen so
# that no English Snowball stemmer rule applies: every name word is its own BM25 term.
_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr",
           "st", "th")
_VOWELS, _CODAS = "aeiou", ("", "", "", "r", "l", "n", "s")
_LAST_VOWELS, _LAST_CODAS = "aou", ("", "", "n", "m", "k", "th")


def _syllable_pattern() -> str:
    """A regex matching each syllable of a name word after its first: an onset and a vowel, and a coda unless
    a vowel follows it (then it is the next onset). Only inside words that start like a name (a capitalised
    onset, then a vowel), so that ordinary words keep their BPE merges."""
    onset = "(?:" + "|".join(sorted(_ONSETS, key=len, reverse=True)) + ")"
    first = "(?:" + "|".join(sorted((o.capitalize() for o in _ONSETS), key=len, reverse=True)) + ")"
    codas = sorted({c for c in _CODAS + _LAST_CODAS if c}, key=len, reverse=True)
    return rf"(?<=\b{first}[aeiou][a-z]*){onset}[aeiou](?:(?:{'|'.join(codas)})(?![aeiou]))?"


# The demo tokenizer's split_pattern: names become syllable tokens, the same inventory in every split, so that
# copying an unseen name is copying tokens seen in training (byte-level BPE otherwise cuts each name its own
# way, often after its first letter, which near-duplicates such as Fusso and Fasso then share).
NAME_SYLLABLES = _syllable_pattern()


@dataclasses.dataclass
class Entity:
    """`attributes` maps relation names to a literal (year, occupation, industry) or another entity's id."""

    id: str
    type: str
    name: str
    split: str
    attributes: dict[str, int | str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Passage:
    """One or two facts (`relations`) of entity `entity`, titled with its name."""

    id: str
    entity: str
    relations: tuple[str, ...]
    title: str
    text: str

    def to_json(self) -> dict[str, str]:
        """The FlashRAG corpus row."""
        return {"id": self.id, "contents": f'"{self.title}"\n{self.text}'}


@dataclasses.dataclass(frozen=True)
class World:
    """Entities (by id), the corpus and the question splits of one seed; `options` are the generator's."""

    seed: int
    options: dict[str, Any]
    entities: dict[str, Entity]
    passages: list[Passage]
    questions: dict[str, list[dict[str, Any]]]

    def summary(self) -> dict[str, Any]:
        """Entities per type, passages, and per split: questions, distinct subjects, counts by kind."""
        splits = {}
        for split, questions in self.questions.items():
            kinds = sorted(f"{q['metadata']['hops']}-hop {q['metadata']['type']}" for q in questions)
            splits[split] = {"questions": len(questions),
                             "subjects": len({s for q in questions for s in q["metadata"]["subjects"]}),
                             **{kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}}
        types = {t: 0 for t in ENTITY_TYPES}
        for e in self.entities.values():
            types[e.type] += e.split != DISTRACTOR
        distractors = len(self.entities) - sum(types.values())
        return {"seed": self.seed, "entities": types, "distractor_entities": distractors,
                "passages": len(self.passages), "splits": splits}


class Namer:
    """Unique syllable words and unique entity names, drawn from one rng."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.words: set[str] = set()
        self.names: set[str] = set()

    def _syllable(self, vowels: str, codas: tuple[str, ...]) -> str:
        return self.rng.choice(_ONSETS) + self.rng.choice(vowels) + self.rng.choice(codas)

    def word(self) -> str:
        """A word no other name uses."""
        while True:
            body = "".join(self._syllable(_VOWELS, _CODAS) for _ in range(self.rng.choice((1, 1, 1, 2))))
            word = (body + self._syllable(_LAST_VOWELS, _LAST_CODAS)).capitalize()
            if word not in self.words:
                self.words.add(word)
                return word

    def claim(self, name: str) -> bool:
        """Reserves `name`; False when it is taken."""
        if name in self.names:
            return False
        self.names.add(name)
        return True

    def variant(self, word: str) -> str | None:
        """A free near-duplicate of a word: one vowel before the last changed (Fusso -> Fasso), or None."""
        spots = [i for i, c in enumerate(word) if c in _VOWELS][:-1]  # words start with a consonant
        for _ in range(8):
            i = self.rng.choice(spots)
            new = word[:i] + self.rng.choice([v for v in _VOWELS if v != word[i]]) + word[i + 1:]
            if new not in self.words and self.claim(new):
                self.words.add(new)
                return new
        return None


def _largest_remainder(total: int, fractions: list[float]) -> list[int]:
    """Splits `total` into integer counts proportional to `fractions` (which sum to 1)."""
    raw = [total * f for f in fractions]
    counts = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: counts[i] - raw[i])[:total - sum(counts)]:
        counts[i] += 1
    return counts


def _draw_value(rel: Relation, etype: str, rng: random.Random, pools: dict[str, list[str]]) -> int | str:
    """A random value of `rel` for an entity of type `etype`."""
    if rel.target is not None:
        return rng.choice(pools[rel.target])
    if rel.name in LITERALS:
        return rng.choice(LITERALS[rel.name])
    return rng.randint(*YEAR_RANGES[etype])


def _real_entities(rng: random.Random, namer: Namer, num_entities: int, dev_fraction: float,
                   test_fraction: float) -> dict[str, Entity]:
    """The question-bearing entities with names, facts and a split (stratified by type)."""
    counts = {t: max(2, round(TYPE_SHARES[t] * num_entities)) for t in ENTITY_TYPES}
    # A name word is shared by a few persons, with at least twice as many (first, last) pairs as persons.
    n_words = max(counts["person"] // 4, math.isqrt(2 * counts["person"]) + 1)
    firsts, lasts = [namer.word() for _ in range(n_words)], [namer.word() for _ in range(n_words)]
    entities: dict[str, Entity] = {}
    for etype in ENTITY_TYPES:
        ranks = list(range(counts[etype]))
        rng.shuffle(ranks)
        n_dev, n_test = round(dev_fraction * len(ranks)), round(test_fraction * len(ranks))
        for i, rank in enumerate(ranks):
            split = "dev" if rank < n_dev else "test" if rank < n_dev + n_test else "train"
            if etype == "person":
                while not namer.claim(name := f"{rng.choice(firsts)} {rng.choice(lasts)}"):
                    pass
            else:
                name = namer.word() + (f" {rng.choice(ORG_SUFFIXES)}" if etype == "organisation" else "")
                namer.claim(name)
            entities[f"{etype}_{i}"] = Entity(f"{etype}_{i}", etype, name, split)
    pools = {t: [e.id for e in entities.values() if e.type == t] for t in ENTITY_TYPES}
    for e in entities.values():
        e.attributes = {r.name: _draw_value(r, e.type, rng, pools) for r in TYPE_RELATIONS[e.type]}
    for city, country in zip(pools["city"], pools["country"]):  # every country has a city
        entities[city].attributes["country"] = country
    cities_of: dict[str, list[str]] = {}
    for city in pools["city"]:
        cities_of.setdefault(str(entities[city].attributes["country"]), []).append(city)
    for country in pools["country"]:
        entities[country].attributes["capital"] = rng.choice(cities_of[country])
    return entities


def _twin_name(namer: Namer, rng: random.Random, original: Entity,
               person_words: tuple[list[str], list[str]]) -> str | None:
    """A free name sharing a word with, or one vowel away from, the original's, or None. A person's twin
    keeps its first or last name and draws the other from the same word list, so no two persons have the
    same words in another order."""
    if original.type == "person":
        first, last = original.name.split(" ")
        firsts, lasts = person_words
        name = f"{first} {rng.choice(lasts)}" if rng.random() < 0.5 else f"{rng.choice(firsts)} {last}"
    elif original.type == "organisation":
        name = f"{original.name.split(' ')[0]} {rng.choice(ORG_SUFFIXES)}"
    else:
        return namer.variant(original.name)
    return name if namer.claim(name) else None


def _add_distractors(rng: random.Random, namer: Namer, entities: dict[str, Entity], count: int) -> None:
    """Adds up to `count` twins of random entities, each fact copied from the original with probability 1/2.
    Twins are never question subjects nor the value of another entity's fact."""
    real = list(entities.values())
    pools = {t: [e.id for e in real if e.type == t] for t in ENTITY_TYPES}
    names = [e.name.split(" ") for e in real if e.type == "person"]
    person_words = (sorted({first for first, _ in names}), sorted({last for _, last in names}))
    for i in range(count):
        original = rng.choice(real)
        name = _twin_name(namer, rng, original, person_words)
        if name is None:
            continue
        attributes = {r.name: original.attributes[r.name] if rng.random() < 0.5
                      else _draw_value(r, original.type, rng, pools) for r in TYPE_RELATIONS[original.type]}
        twin_id = f"{DISTRACTOR}_{i}"
        entities[twin_id] = Entity(twin_id, original.type, name, DISTRACTOR, attributes)


def value_text(entities: dict[str, Entity], rel: Relation, value: int | str) -> str:
    """How a fact's value is written: an entity's name, or the literal itself."""
    return entities[value].name if rel.target is not None else str(value)


def _passages(rng: random.Random, entities: dict[str, Entity], pair_fraction: float) -> list[Passage]:
    """Each entity's facts, one per passage or (with probability `pair_fraction`) two per passage, shuffled
    over the corpus; passage ids are corpus positions."""
    drafts = []
    for e in entities.values():
        rels = list(TYPE_RELATIONS[e.type])
        group = 2 if rng.random() < pair_fraction else 1
        if group == 2:
            rng.shuffle(rels)
        for start in range(0, len(rels), group):
            sentences = []
            for j, rel in enumerate(rels[start:start + group]):
                subject = e.name if j == 0 else REFERENCES[e.type]
                value = value_text(entities, rel, e.attributes[rel.name])
                sentence = rng.choice(rel.facts).format(k=rel.keyword, s=subject, v=value)
                sentences.append(sentence[0].upper() + sentence[1:])
            names = tuple(r.name for r in rels[start:start + group])
            drafts.append((e.id, names, e.name, " ".join(sentences)))
    rng.shuffle(drafts)
    return [Passage(str(i), *draft) for i, draft in enumerate(drafts)]


def _relation_paths() -> dict[str, dict[int, list[tuple[Relation, ...]]]]:
    """Every chain of 1..MAX_HOPS relations starting at each entity type: {type: {hops: [path, ...]}}."""
    paths: dict[str, dict[int, list[tuple[Relation, ...]]]] = {t: {} for t in ENTITY_TYPES}

    def extend(start: str, etype: str, path: tuple[Relation, ...]) -> None:
        for rel in TYPE_RELATIONS[etype]:
            longer = path + (rel,)
            paths[start].setdefault(len(longer), []).append(longer)
            if rel.target is not None and len(longer) < MAX_HOPS:
                extend(start, rel.target, longer)

    for t in ENTITY_TYPES:
        extend(t, t, ())
    return paths


PATHS = _relation_paths()


class _QuestionMaker:
    """Draws the questions of one split from its subject pool; rejects repeats and chains that revisit an
    entity (whose answer would be in the question)."""

    def __init__(self, rng: random.Random, entities: dict[str, Entity],
                 fact_passage: dict[tuple[str, str], str], pool: list[str]):
        self.rng, self.entities, self.fact_passage, self.pool = rng, entities, fact_passage, pool
        self.pool_of_type: dict[str, list[str]] = {}
        for entity_id in pool:
            self.pool_of_type.setdefault(entities[entity_id].type, []).append(entity_id)
        self.seen: set[Any] = set()

    def bridge(self, hops: int) -> dict[str, Any] | None:
        """A chain of `hops` facts from a random subject, or None."""
        subject = self.entities[self.rng.choice(self.pool)]
        path = self.rng.choice(PATHS[subject.type][hops])
        if (subject.id, path) in self.seen:
            return None
        node, visited, plan, support, answers = subject, {subject.id}, [], [], []
        for rel in path:
            plan.append(f"{node.name} {rel.keyword}")
            support.append(self.fact_passage[node.id, rel.name])
            value = node.attributes[rel.name]
            answers.append(value_text(self.entities, rel, value))
            if rel.target is not None:
                if value in visited:
                    return None
                visited.add(str(value))
                node = self.entities[value]
        self.seen.add((subject.id, path))
        phrase = subject.name
        for rel in path[:-1]:
            phrase = rel.phrase.format(x=phrase)
        question = self.rng.choice(path[-1].questions).format(x=phrase)
        return _record(question, answers[-1], "bridge", [subject.id], path, plan, support, answers)

    def comparison(self) -> dict[str, Any] | None:
        """Which of two subjects of one type was born / founded earlier (or later), or None."""
        a = self.entities[self.rng.choice(self.pool)]
        b = self.entities[self.rng.choice(self.pool_of_type[a.type])]
        rel = RELATIONS[YEAR_RELATION[a.type]]
        year_a, year_b = a.attributes[rel.name], b.attributes[rel.name]
        if year_a == year_b or frozenset((a.id, b.id)) in self.seen:
            return None
        self.seen.add(frozenset((a.id, b.id)))
        order = self.rng.choice(("earlier", "later"))
        answer = a if (year_a < year_b) == (order == "earlier") else b
        question = COMPARISONS[rel.name].format(order=order, a=a.name, b=b.name, noun=a.type)
        return _record(question, answer.name, "comparison", [a.id, b.id], (rel, rel),
                       [f"{a.name} {rel.keyword}", f"{b.name} {rel.keyword}"],
                       [self.fact_passage[a.id, rel.name], self.fact_passage[b.id, rel.name]],
                       [str(year_a), str(year_b)])

    def questions(self, split: str, total: int, hop_fractions: list[float],
                  comparison_fraction: float) -> list[dict[str, Any]]:
        """`total` questions in the requested hop mix (fewer when the pool runs out of distinct ones),
        shuffled, with ids "{split}_{i}"."""
        one, two, three = _largest_remainder(total, hop_fractions)
        n_comparison = round(comparison_fraction * two)
        wanted = [(lambda: self.bridge(1), one), (lambda: self.bridge(2), two - n_comparison),
                  (self.comparison, n_comparison), (lambda: self.bridge(3), three)]
        questions = []
        for draw, count in wanted:
            made = []
            for _ in range(50 * count):
                if len(made) == count:
                    break
                if (record := draw()) is not None:
                    made.append(record)
            questions += made
        self.rng.shuffle(questions)
        for i, q in enumerate(questions):
            q["id"] = f"{split}_{i}"
        return questions


def _record(question: str, answer: str, kind: str, subjects: list[str], path: tuple[Relation, ...],
            plan: list[str], support: list[str], hop_answers: list[str]) -> dict[str, Any]:
    """A FlashRAG QA row; its id is set once the split is shuffled."""
    return {"id": "", "question": question, "golden_answers": [answer], "metadata": {
        "hops": len(plan), "type": kind, "supporting_ids": support, "plan": plan, "hop_answers": hop_answers,
        "subjects": subjects, "relations": [r.name for r in path]}}


def generate_world(seed: int, num_entities: int, *, questions_per_entity: float = 1.0,
                   hop_fractions: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3),
                   comparison_fraction: float = 0.3, dev_fraction: float = 0.1, test_fraction: float = 0.1,
                   pair_fraction: float = 0.5, distractor_fraction: float = 0.25) -> World:
    """A world of `num_entities` question-bearing entities (in TYPE_SHARES, at least two per type) plus
    `distractor_fraction` as many near-duplicate twins.

    Each split gets `questions_per_entity` questions per entity of the split; `hop_fractions` are the shares
    of 1-, 2- and 3-hop questions and `comparison_fraction` the share of comparisons among the 2-hop ones.
    `pair_fraction` is the chance that an entity states its facts two per passage instead of one.
    """
    if num_entities < 8:
        raise ValueError(f"num_entities must be >= 8 (two of each type), got {num_entities}")
    if len(hop_fractions) != MAX_HOPS or min(hop_fractions) < 0 or not sum(hop_fractions) > 0:
        raise ValueError(f"hop_fractions must be {MAX_HOPS} non-negative shares, got {hop_fractions}")
    fractions = dict(comparison_fraction=comparison_fraction, dev_fraction=dev_fraction,
                     test_fraction=test_fraction, pair_fraction=pair_fraction,
                     distractor_fraction=distractor_fraction)
    for name, value in fractions.items():
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    if dev_fraction + test_fraction >= 1:
        raise ValueError(f"dev_fraction + test_fraction must be < 1, got {dev_fraction + test_fraction}")
    if questions_per_entity < 0:
        raise ValueError(f"questions_per_entity must be >= 0, got {questions_per_entity}")
    options = dict(num_entities=num_entities, questions_per_entity=questions_per_entity,
                   hop_fractions=[f / sum(hop_fractions) for f in hop_fractions], **fractions)
    rng = random.Random(seed)
    namer = Namer(rng)
    entities = _real_entities(rng, namer, num_entities, dev_fraction, test_fraction)
    _add_distractors(rng, namer, entities, round(distractor_fraction * len(entities)))
    passages = _passages(rng, entities, pair_fraction)
    fact_passage = {(p.entity, rel): p.id for p in passages for rel in p.relations}
    questions = {}
    for split in SPLITS:
        pool = [e.id for e in entities.values() if e.split == split]
        maker = _QuestionMaker(rng, entities, fact_passage, pool)
        questions[split] = maker.questions(split, round(questions_per_entity * len(pool)),
                                           options["hop_fractions"], comparison_fraction) if pool else []
    return World(seed, options, entities, passages, questions)


def _jsonl_lines(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    return (json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_world(world: World, out_dir: str | pathlib.Path) -> dict[str, pathlib.Path]:
    """Writes corpus.jsonl, train/dev/test.jsonl and world.json to `out_dir`; returns {stem: path}."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.jsonl" for name in ("corpus", *SPLITS)}
    with open(paths["corpus"], "w", encoding="utf-8") as f:
        f.writelines(_jsonl_lines(p.to_json() for p in world.passages))
    for split in SPLITS:
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(_jsonl_lines(world.questions[split]))
    paths["world"] = out / "world.json"
    info = {"seed": world.seed, "options": world.options, "summary": world.summary(),
            "entities": [dataclasses.asdict(e) for e in world.entities.values()]}
    paths["world"].write_text(json.dumps(info, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    out = flags.DEFINE_string("out", None, "output directory", required=True, flag_values=values)
    seed = flags.DEFINE_integer("seed", 0, "random seed of the world", flag_values=values)
    entities = flags.DEFINE_integer("entities", 1000, "question-bearing entities", flag_values=values)
    questions_per_entity = flags.DEFINE_float("questions_per_entity", 1.0, "questions per entity of a split",
                                              flag_values=values)
    hop_fractions_text = flags.DEFINE_string("hop_fractions", "1,1,1", "shares of 1-, 2- and 3-hop questions",
                                             flag_values=values)
    comparison_fraction = flags.DEFINE_float("comparison_fraction", 0.3, "share of 2-hop comparisons",
                                             flag_values=values)
    dev_fraction = flags.DEFINE_float("dev_fraction", 0.1, "share of question-bearing entities in dev",
                                      flag_values=values)
    test_fraction = flags.DEFINE_float("test_fraction", 0.1, "share of question-bearing entities in test",
                                       flag_values=values)
    pair_fraction = flags.DEFINE_float("pair_fraction", 0.5, "chance of two facts per passage",
                                       flag_values=values)
    distractor_fraction = flags.DEFINE_float("distractor_fraction", 0.25,
                                             "near-duplicate twins per question-bearing entity",
                                             flag_values=values)
    cli.parse(values, argv, __doc__)
    try:
        hop_fractions = tuple(float(x) for x in hop_fractions_text.value.split(","))
    except ValueError:
        raise app.UsageError("--hop_fractions: expected three comma-separated numbers, "
                             f"got {hop_fractions_text.value!r}") from None
    start = time.perf_counter()
    try:
        world = generate_world(seed.value, entities.value, questions_per_entity=questions_per_entity.value,
                               hop_fractions=hop_fractions, comparison_fraction=comparison_fraction.value,
                               dev_fraction=dev_fraction.value, test_fraction=test_fraction.value,
                               pair_fraction=pair_fraction.value,
                               distractor_fraction=distractor_fraction.value)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    write_world(world, out.value)
    seconds = round(time.perf_counter() - start, 2)
    print(json.dumps({**world.summary(), "out": out.value, "seconds": seconds}, indent=1))


if __name__ == "__main__":
    cli.run(main)
