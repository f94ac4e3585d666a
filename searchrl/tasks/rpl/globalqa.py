"""GlobalQA-style corpus-level tasks over a synthetic world (Retrieval Program Learning's evaluation).

A task is about a *group*: every entity whose fact of one membership relation has one value ("organisations
headquartered in Velo", "persons whose occupation is painter"), distractor twins included, since their
passages state the fact just as well. Four types, as in RPL's GlobalQA:

- count:  how many members the group has; the answer is the members' membership passages (a set);
- sort:   all members by their year (birth / founding), earliest or latest first;
- topk:   the k members with the earliest (latest) years, in that order;
- minmax: the one member with the earliest (latest) year.

Answers are passage ids (`golden_answers`), for the year types the passages stating the selected members'
years, in the asked order. `evidence_ids` are every passage needed to verify the answer: the membership
passage of each member, and for the year types each member's year passage. One top-3 search cannot cover
them; a program that retrieves broadly and filters can.

Groups have MIN_GROUP..max_answer members; a year type skips a group in which two members share a year (the
order would be ambiguous). Splits follow the world's split by subject: a group keyed by an entity (a city,
an organisation, a country) is in that entity's split; a literal group (an occupation, an industry) is drawn
into dev / test / train with the world's dev and test fractions.

Records are FlashRAG QA rows, read by the project's "qa" reader unchanged:
{"id", "question", "golden_answers": [passage id, ...], "metadata": {"type", "ordered", "evidence_ids",
"entities" (the answer's entities, in answer order), "group" (every member), "relation", "value",
"keyword", "attribute", "order", "k", "count", "years", "plan"}}.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import random
from typing import Any, Iterable, Sequence

from searchrl.demo.synthetic import RELATIONS, SPLITS, YEAR_RELATION, Entity, World, value_text

TYPES = ("topk", "count", "sort", "minmax")
ORDERED_TYPES = ("topk", "sort")
ORDERS = ("earliest", "latest")
MIN_GROUP = 3


@dataclasses.dataclass(frozen=True)
class Membership:
    """Groups entities of type `member` by the value of their fact `relation`; `plural` and `singular` name
    a group in a question ({v}: the value), with the relation's keyword or its stem."""

    relation: str
    member: str
    plural: str
    singular: str


MEMBERSHIPS = (
    Membership("headquarters", "organisation", "organisations headquartered in {v}",
               "organisation headquartered in {v}"),
    Membership("birthplace", "person", "persons whose birthplace is {v}", "person whose birthplace is {v}"),
    Membership("employer", "person", "persons employed by {v}", "person employed by {v}"),
    Membership("country", "city", "cities of the country {v}", "city of the country {v}"),
    Membership("occupation", "person", "persons whose occupation is {v}", "person whose occupation is {v}"),
    Membership("industry", "organisation", "organisations in the {v} industry",
               "organisation in the {v} industry"),
)
VERBS = {"birth_year": "born", "founding_year": "founded"}
TEMPLATES = {
    "count": ("How many {plural} are there?", "Count the {plural}.", "What is the number of {plural}?"),
    "sort": ("Sort the {plural} by {year}, {order} first.",
             "List all {plural} from the {order} {year} to the {other}."),
    "topk": ("Of the {plural}, which {k} were {verb} {order}? List them {order} first.",
             "Which {k} {plural} have the {order} {year}? Order them {order} first."),
    "minmax": ("Of the {plural}, which one was {verb} {order}?", "Which {singular} has the {order} {year}?"),
}


@dataclasses.dataclass(frozen=True)
class Group:
    """The `members` (entity ids) whose `membership` fact has the value written `value`, in one split."""

    membership: Membership
    value: str
    members: tuple[str, ...]
    split: str


def _groups(world: World, rng: random.Random, max_answer: int) -> list[Group]:
    """Every group of MIN_GROUP..max_answer members, with its split."""
    dev, test = world.options["dev_fraction"], world.options["test_fraction"]
    groups = []
    for m in MEMBERSHIPS:
        rel = RELATIONS[m.relation]
        members: dict[int | str, list[str]] = {}
        for e in world.entities.values():
            if e.type == m.member:
                members.setdefault(e.attributes[m.relation], []).append(e.id)
        for value, ids in members.items():
            if rel.target is not None:
                split = world.entities[str(value)].split
            else:
                draw = rng.random()
                split = "dev" if draw < dev else "test" if draw < dev + test else "train"
            if MIN_GROUP <= len(ids) <= max_answer:
                groups.append(Group(m, value_text(world.entities, rel, value), tuple(ids), split))
    return groups


def _by_year(entities: dict[str, Entity], members: Sequence[str], order: str) -> list[str] | None:
    """The members sorted by year, `order` first; None when two share a year."""
    year = RELATIONS[YEAR_RELATION[entities[members[0]].type]].name
    years = [entities[m].attributes[year] for m in members]
    if len(set(years)) < len(years):
        return None
    return sorted(members, key=lambda m: entities[m].attributes[year], reverse=order == "latest")


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _task(world: World, fact_passage: dict[tuple[str, str], str], group: Group, kind: str,
          rng: random.Random) -> dict[str, Any] | None:
    """One task of type `kind` about `group` (id set later), or None when the group's years tie."""
    m, entities = group.membership, world.entities
    attribute = YEAR_RELATION[m.member]
    keyword, year_keyword = RELATIONS[m.relation].keyword, RELATIONS[attribute].keyword
    membership_ids = [fact_passage[e, m.relation] for e in group.members]
    plan = [f"{group.value} {keyword}"]
    fields = dict(plural=m.plural.format(v=group.value), singular=m.singular.format(v=group.value),
                  year=year_keyword, verb=VERBS[attribute])
    order = k = None
    if kind == "count":
        chosen, answer, evidence, attribute = list(group.members), membership_ids, membership_ids, None
    else:
        order = rng.choice(ORDERS)
        ranked = _by_year(entities, group.members, order)
        if ranked is None:
            return None
        k = rng.randint(2, len(ranked) - 1) if kind == "topk" else 1 if kind == "minmax" else len(ranked)
        chosen = ranked[:k]
        answer = [fact_passage[e, attribute] for e in chosen]
        evidence = membership_ids + [fact_passage[e, attribute] for e in group.members]
        plan += [f"{entities[e].name} {year_keyword}" for e in group.members]
        fields.update(order=order, other=ORDERS[order == "earliest"], k=k)
    question = rng.choice(TEMPLATES[kind]).format(**fields)
    return {"id": "", "question": question, "golden_answers": _unique(answer), "metadata": {
        "type": kind, "ordered": kind in ORDERED_TYPES, "evidence_ids": _unique(evidence), "entities": chosen,
        "group": list(group.members), "relation": m.relation, "value": group.value, "keyword": keyword,
        "attribute": attribute, "order": order, "k": k, "count": len(group.members),
        "years": [entities[e].attributes[attribute] for e in chosen] if attribute else [], "plan": plan}}


def generate_tasks(world: World, seed: int, per_type: int = 25, max_answer: int = 8
                   ) -> dict[str, list[dict[str, Any]]]:
    """Up to `per_type` tasks of each type per split (one per group and type), about groups of
    MIN_GROUP..`max_answer` members; each split shuffled, with ids "globalqa_{split}_{i}"."""
    if max_answer < MIN_GROUP:
        raise ValueError(f"max_answer must be >= {MIN_GROUP}, got {max_answer}")
    rng = random.Random(seed)
    fact_passage = {(p.entity, rel): p.id for p in world.passages for rel in p.relations}
    groups = _groups(world, rng, max_answer)
    tasks = {}
    for split in SPLITS:
        pool = [g for g in groups if g.split == split]
        made = []
        for kind in TYPES:
            of_kind = []
            for group in rng.sample(pool, len(pool)):
                if len(of_kind) == per_type:
                    break
                if (task := _task(world, fact_passage, group, kind, rng)) is not None:
                    of_kind.append(task)
            made += of_kind
        rng.shuffle(made)
        for i, task in enumerate(made):
            task["id"] = f"globalqa_{split}_{i}"
        tasks[split] = made
    return tasks


def write_tasks(tasks: dict[str, list[dict[str, Any]]], out_dir: str | pathlib.Path,
                name: str = "globalqa") -> dict[str, pathlib.Path]:
    """Writes out_dir/<name>/<split>.jsonl per split (the "qa" dataset layout); returns {split: path}."""
    root = pathlib.Path(out_dir) / name
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, records in tasks.items():
        paths[split] = root / f"{split}.jsonl"
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return paths
