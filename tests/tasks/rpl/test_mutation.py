"""Program mutation: each edit's exact variants, legality and action-space restriction of every variant,
verification against a fake corpus, the SFT segments, and fuzzing."""
import ast
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchrl.tasks.rpl import language, mutation
from searchrl.tasks.rpl.env import ACTION_SPACES, set_f1
from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.mutation import Mutation, mutate, mutations, verify
from searchrl.tasks.rpl.sdk import SDK_FUNCTIONS
from tests.tasks.rpl.program_helpers import SDK, ids, run
from tests.tasks.rpl.test_fuzz import PRELUDE, statements

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
RUNTIME_LIMITS = ("show limit", "retrieval limit", "docs limit")  # what a well-typed variant may still reach


def edit(name: str, source: str) -> list[str]:
    return mutation.EDITS[name](ast.parse(source))


@pytest.mark.parametrize("name, source, expected", [
    ("top_k", "show(sparse_retrieval('cat', 4))",
     [f"show(sparse_retrieval('cat', {k}))" for k in (2, 8, 1, 3, 5, 10, 20)]),
    ("top_k", "show(rerank('cat', docs, top_k=2))",
     [f"show(rerank('cat', docs, top_k={k}))" for k in (1, 4, 3, 5, 10, 20)]),
    ("top_k", "show(dense_retrieval('cat'))",  # the default, 10
     [f"show(dense_retrieval('cat', top_k={k}))" for k in (5, 20, 1, 3)]),
    ("top_k", "k = 3\nshow(sparse_retrieval('cat', k))", []),
    ("swap_retriever",
     "a = sparse_retrieval('cat', 3)\nb = dense_retrieval('dog', top_k=2)\nshow(fuse(a, b))",
     ["a = dense_retrieval('cat', 3)\nb = dense_retrieval('dog', top_k=2)\nshow(fuse(a, b))",
      "a = sparse_retrieval('cat', 3)\nb = sparse_retrieval('dog', top_k=2)\nshow(fuse(a, b))"]),
    ("add_fuse", "show(sparse_retrieval('cat', 3))",
     ["show(fuse(sparse_retrieval('cat', 3), dense_retrieval('cat', 3)))",
      "show(fuse(sparse_retrieval('cat', 3), dense_retrieval('cat', 3), top_k=3))"]),
    ("add_fuse", "show(dense_retrieval('cat'))",
     ["show(fuse(dense_retrieval('cat'), sparse_retrieval('cat')))"]),
    ("add_fuse", "show(fuse(sparse_retrieval('cat', 3), dense_retrieval('cat', 3)))", []),
    ("add_dedup", "docs = sparse_retrieval('a', 2) + dense_retrieval('a', 2)\nshow(docs[:3])\nshow(docs)",
     ["docs = sparse_retrieval('a', 2) + dense_retrieval('a', 2)\nshow(dedup(docs)[:3])\nshow(docs)",
      "docs = sparse_retrieval('a', 2) + dense_retrieval('a', 2)\nshow(docs[:3])\nshow(dedup(docs))"]),
    ("add_dedup", "show(fuse(a, b))\nshow(dedup(a)[:2])\nshow(a[0])", []),
    ("add_rerank", "q = 'cat'\ndocs = sparse_retrieval(q, 5)\nshow(docs[:2])",
     ["q = 'cat'\ndocs = sparse_retrieval(q, 5)\nshow(rerank(q, docs, top_k=2))"]),
    ("add_rerank", "show(dense_retrieval('cat', 3))", ["show(rerank('cat', dense_retrieval('cat', 3)))"]),
    ("add_rerank", "for q in ['a', 'b']:\n    show(sparse_retrieval(q, 2))", []),  # no literal query
    ("split_query", "show(sparse_retrieval('cat food, dog toys and bird seed', 2))",
     ["show(fuse(sparse_retrieval('cat food', 2), sparse_retrieval('dog toys and bird seed', 2)))",
      "show(fuse(sparse_retrieval('cat food', 2), sparse_retrieval('dog toys and bird seed', 2), top_k=2))",
      "show(fuse(sparse_retrieval('cat food, dog toys', 2), sparse_retrieval('bird seed', 2)))",
      "show(fuse(sparse_retrieval('cat food, dog toys', 2), sparse_retrieval('bird seed', 2), top_k=2))",
      "show(fuse(sparse_retrieval('cat food', 2), sparse_retrieval('dog toys', 2), "
      "sparse_retrieval('bird seed', 2)))",
      "show(fuse(sparse_retrieval('cat food', 2), sparse_retrieval('dog toys', 2), "
      "sparse_retrieval('bird seed', 2), top_k=2))"]),
    ("split_query", "q = 'cats and dogs'\nshow(dense_retrieval(q))",
     ["q = 'cats and dogs'\nshow(fuse(dense_retrieval('cats'), dense_retrieval('dogs')))"]),
    ("split_query", "q = 'cats and dogs'\nq = 'x'\nshow(dense_retrieval(q))", []),  # q is bound twice
    ("resize_shown", "docs = sparse_retrieval('cat', 10)\nshow(docs[:4])",
     [f"docs = sparse_retrieval('cat', 10)\nshow(docs[{window}])"
      for window in (":3", ":5", ":2", ":8", "1:4", "1:5")]
     + ["docs = sparse_retrieval('cat', 10)\nshow(docs)"]),
    ("resize_shown", "show(docs[2:4])",  # ends at 3, 5 or 8 (not 2), starts at 3, moves down or up by one
     [f"show(docs[{window}])" for window in ("2:3", "2:5", "2:8", "3:4", "3:5", "1:3")] + ["show(docs)"]),
    ("resize_shown", "show(docs[1:])", ["show(docs[2:])", "show(docs)"]),
    ("resize_shown", "show(docs[3:])", ["show(docs[4:])", "show(docs[2:])", "show(docs)"]),
    ("resize_shown", "show(sparse_retrieval('cat', 10))",
     [f"show(sparse_retrieval('cat', 10)[{window}])" for window in (":1", ":3", ":5", "1:")]),
    ("resize_shown", "k = 2\nshow(docs[:k])", ["k = 2\nshow(docs)"]),
])
def test_edits(name, source, expected):
    assert edit(name, source) == expected


PROGRAMS = [
    "show(sparse_retrieval('cat', 3))",
    "q = 'cats and dogs, birds'\ndocs = dense_retrieval(q, 4)\nshow(docs[:3])",
    "runs = [sparse_retrieval(q, top_k=3) for q in ['cat', 'dog']]\nshow(dedup(fuse(*runs, top_k=4)))",
    "q = 'cat'\nbest = rerank(q, sparse_retrieval(q, 5) + dense_retrieval(q, 5), 3)\nshow(best)",
    "for sub in ['cat', 'dog']:\n    show(sparse_retrieval(sub, 2)[:1])",
]


@pytest.mark.parametrize("source", PROGRAMS)
def test_every_variant_is_legal_and_runs(source):
    assert run(source).error is None
    variants = mutations(source)
    assert variants and len({m.source for m in variants}) == len(variants)
    assert {m.edit for m in variants} <= set(mutation.EDITS)
    for variant in variants:
        assert variant.source not in (source, ast.unparse(ast.parse(source)))
        language.parse(variant.source, Limits())
        error = run(variant.source).error
        assert error is None or error.split(":")[0] in RUNTIME_LIMITS, (variant, error)


def test_edits_take_turns_and_the_cap_keeps_the_first():
    source = PROGRAMS[1]
    variants = mutations(source)
    assert [m.edit for m in variants[:7]] == list(mutation.EDITS)
    assert mutate(source, max_variants=5) == [m.source for m in variants[:5]]
    assert mutate(source, max_variants=0) == []


def test_action_space_restriction():
    sparse_only = mutations("show(sparse_retrieval('cat', 3))", ("sparse_retrieval",))
    assert {m.edit for m in sparse_only} == {"top_k", "resize_shown"}
    assert all("dense" not in m.source for m in sparse_only)
    for space in ACTION_SPACES.values():
        for source in PROGRAMS:
            for variant in mutate(source, space):
                called = set(re.findall(r"(\w+)\(", variant)) & set(SDK_FUNCTIONS)
                assert called <= set(space), (space, variant)
    # An unavailable function leaves only the variants without it.
    swapped = mutate("show(dense_retrieval('cat', 3))", ["sparse_retrieval"])
    assert swapped == ["show(sparse_retrieval('cat', 3))"]


@pytest.mark.parametrize("source", ["show(", "import os", "x.y = 1", 7])
def test_programs_that_do_not_parse_have_no_variants(source):
    assert mutate(source) == []


GOLD = ("s:cat:4", "d:cat:0")  # the fake retrievers rank "<s|d>:<query>:<rank>"; the original sees s:cat:0-2


def doc_f1(result):
    return set_f1(ids(result), GOLD)


def test_verify_keeps_the_improving_variants_within_the_budget():
    source = "show(sparse_retrieval('cat', 3))"
    variants = mutations(source, ("sparse_retrieval", "dense_retrieval", "fuse"))
    assert doc_f1(run(source)) == 0
    verified = verify(source, variants, SDK, doc_f1, max_shown=5)
    # Widened to 5, swapped to dense, or fused with dense and cut to 3 (rrf_k=1: s:cat:0, d:cat:0, s:cat:1).
    # Widened to 6, 10 or 20, or fused without a cut (6 docs), they show more than the budget of 5.
    assert [(v.source, v.edit, v.shown_count, v.baseline) for v in verified] == [
        ("show(dense_retrieval('cat', 3))", "swap_retriever", 3, 0.0),
        ("show(fuse(sparse_retrieval('cat', 3), dense_retrieval('cat', 3), top_k=3))", "add_fuse", 3, 0.0),
        ("show(sparse_retrieval('cat', 5))", "top_k", 5, 0.0)]
    assert [v.score for v in verified] == pytest.approx([0.4, 0.4, 2 / 7])
    # No budget but the sandbox's (10 shown): 6 and 10 docs verify; top_k=20 stops with a show limit error.
    unbudgeted = {v.source for v in verify(source, variants, SDK, doc_f1)}
    assert unbudgeted == {v.source for v in verified} | {
        "show(sparse_retrieval('cat', 6))", "show(sparse_retrieval('cat', 10))",
        "show(fuse(sparse_retrieval('cat', 3), dense_retrieval('cat', 3)))"}
    assert verify(source, [Mutation("show(sparse_retrieval('cat', 20))", "top_k")], SDK, doc_f1,
                  limits=Limits(max_shown=20)) != []
    # Given the original's score (`baseline`), verify does not run the original again: one score fewer.
    scored = []

    def counted(result):
        scored.append(result)
        return doc_f1(result)
    assert verify(source, variants, SDK, counted, max_shown=5, baseline=0.0) == verified
    given = len(scored)
    assert verify(source, variants, SDK, counted, max_shown=5) == verified
    assert len(scored) == 2 * given + 1


def test_verify_needs_a_strict_improvement():
    source = "show(dense_retrieval('cat', 1))"  # already finds d:cat:0 alone: F1 2/3
    same = [Mutation("show(dense_retrieval('cat', 1)[:1])", "resize_shown")]
    assert verify(source, same, SDK, doc_f1) == []


def test_climb_reaches_a_window_no_single_edit_reaches():
    """The gold are ranks 2 and 3 and the budget is two documents: moving the window from [:2] to [2:4]
    takes two verified edits, each scored against the one before; the climb stops at the best."""
    gold = ("s:cat:2", "s:cat:3")

    def score(result):
        return set_f1(ids(result), gold)
    source = "show(sparse_retrieval('cat', 8)[:2])"
    path = mutation.climb(source, SDK, score, ("sparse_retrieval",), max_shown=2, rounds=4)
    assert [(v.source, v.edit, v.shown_count) for v in path] == [
        ("show(sparse_retrieval('cat', 8)[1:3])", "resize_shown", 2),
        ("show(sparse_retrieval('cat', 8)[2:4])", "resize_shown", 2)]
    assert [v.baseline for v in path] == pytest.approx([0.0, 0.5])
    assert [v.score for v in path] == pytest.approx([0.5, 1.0])
    assert mutation.climb(source, SDK, score, ("sparse_retrieval",), max_shown=2, rounds=1) == path[:1]
    assert mutation.climb(path[-1].source, SDK, score, ("sparse_retrieval",), max_shown=2, rounds=4) == []


# Fuzzing: programs over the SDK from a small grammar, and arbitrary programs from test_fuzz's grammar.
WORDS = ["cat", "dog", "bird", "food", "toys"]


def query(rng):
    joiners = [" ", " and ", ", ", "; "]
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 4))]
    return "".join(word + rng.choice(joiners) for word in words[:-1]) + words[-1]


def docs_expression(rng, depth):
    """A list of hits."""
    q = rng.choice(["q", repr(query(rng))])
    retrieval = rng.choice(["sparse_retrieval", "dense_retrieval"])
    leaves = [f"{retrieval}({q}, {rng.randint(1, 6)})", f"{retrieval}({q}, top_k={rng.randint(1, 6)})",
              f"{retrieval}({q})"]
    if depth == 0 or rng.random() < 0.4:
        return rng.choice(leaves)
    a, b = docs_expression(rng, depth - 1), docs_expression(rng, depth - 1)
    return rng.choice([f"fuse({a}, {b})", f"fuse({a}, {b}, top_k={rng.randint(1, 8)})", f"dedup({a})",
                       f"rerank(q, {a})", f"rerank({q}, {a}, top_k={rng.randint(1, 5)})", f"{a} + {b}"])


def sdk_program(rng):
    lines = [f"q = {query(rng)!r}", f"docs = {docs_expression(rng, 2)}"]
    shown = rng.choice(["docs", f"docs[:{rng.randint(1, 5)}]", docs_expression(rng, 1)])
    lines.append(f"show({shown})")
    if rng.random() < 0.3:
        lines.append(f"for sub in {[query(rng) for _ in range(2)]!r}:\n    show(sparse_retrieval(sub, 1))")
    return "\n".join(lines)


@settings(max_examples=300, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.sampled_from([*ACTION_SPACES.values(), ("sparse_retrieval", "fuse")]))
def test_fuzz_sdk_programs(seed, available):
    source = sdk_program(random.Random(seed))
    original = run(source, max_docs_retrieved=10_000, max_retrieval_calls=100, max_rerank_docs=1_000)
    variants = mutations(source, available, max_variants=12)
    assert len({m.source for m in variants}) == len(variants) and source not in {m.source for m in variants}
    for variant in variants:
        tree = language.parse(variant.source, Limits()).tree
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)} & set(SDK_FUNCTIONS)
        assert called <= set(available)
        if original.error is None:  # a program that runs has well-typed variants: only limits stop them
            error = run(variant.source, max_docs_retrieved=10_000, max_retrieval_calls=100,
                        max_rerank_docs=1_000).error
            assert error is None or error.split(":")[0] in RUNTIME_LIMITS, (source, variant, error)


@settings(max_examples=30, **SETTINGS)
@given(st.integers(0, 2**32 - 1))
def test_fuzz_arbitrary_programs(seed):
    source = PRELUDE + statements(random.Random(seed), depth=2)
    for variant in mutate(source):
        language.parse(variant, Limits())
