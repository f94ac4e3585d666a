"""Program mutation for Retrieval Program Learning: grammar-constrained local variants of a program,
verified by running them (`searchrl.tasks.rpl.distill` distils them back into the policy).

    variants = mutations(source, available=("sparse_retrieval", "dense_retrieval", "fuse"))
    better = verify(source, variants, sdk, score, max_shown=5)  # strictly better, no error, within budget
    path = climb(source, sdk, score, max_shown=5, rounds=4)  # the best of the best ..., one edit per round

An edit is a small pure function of the program's syntax tree that returns every variant it can make, in
source order (`EDITS`, in grammar order): change a top_k, swap sparse and dense retrieval, fuse a retrieval
with the other retriever, dedup or rerank what is shown, split a query into sub-queries (one retrieval each,
fused), and widen, narrow or move the window that is shown. Variants are regenerated with `ast.unparse`
and kept only when the language's parser accepts them and every SDK function they call is in the action
space.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from typing import Callable, Sequence

from searchrl.tasks.rpl.language import ProgramError, parse
from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.sandbox import RETRIEVALS, ProgramResult, execute
from searchrl.tasks.rpl.sdk import SDK_FUNCTIONS, RetrievalSDK

OTHER_RETRIEVAL = {"sparse_retrieval": "dense_retrieval", "dense_retrieval": "sparse_retrieval"}
TOP_K_VALUES = (1, 3, 5, 10, 20)  # what a top_k may change to, besides half and double its value
DEFAULT_TOP_K = 10  # sparse_retrieval's and dense_retrieval's, when a call gives none
SHOW_SIZES = (1, 3, 5)  # slices a whole shown list may be cut to
# Sub-query splits of a query string: per clause, per "and"-separated part, and both.
SPLITS = (r"\s*[,;?]\s*", r"\s+and\s+", r"\s*[,;?]\s*|\s+and\s+")
_TOP_K_POSITION = {"sparse_retrieval": 1, "dense_retrieval": 1, "rerank": 2}  # fuse takes top_k by keyword

Edit = Callable[[ast.Module], list[str]]
Score = Callable[[ProgramResult], float]


@dataclasses.dataclass(frozen=True)
class Mutation:
    """A variant of a program and the edit (a name in `EDITS`) that made it."""

    source: str
    edit: str


@dataclasses.dataclass(frozen=True)
class Verified:
    """A variant that ran without error, within the context budget, and scored strictly above the original."""

    source: str
    score: float
    baseline: float  # the original program's score
    shown_count: int
    edit: str


# Reading and rewriting trees.

def _nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree`, in source (pre-)order, without recursion."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(list(ast.iter_child_nodes(node))))
    return out


def _slots(tree: ast.AST) -> dict[int, tuple[ast.AST, str, int | None]]:
    """Where each node of `tree` sits, by id: (parent, field, index in the field's list or None)."""
    slots = {}
    for parent in _nodes(tree):
        for field, value in ast.iter_fields(parent):
            for index, child in enumerate(value) if isinstance(value, list) else [(None, value)]:
                slots[id(child)] = (parent, field, index)
    return slots


def _put(slot: tuple[ast.AST, str, int | None], node: ast.AST) -> None:
    parent, field, index = slot
    if index is None:
        setattr(parent, field, node)
    else:
        getattr(parent, field)[index] = node


def _variants(tree: ast.Module, rewrite: Callable[[ast.AST], list[ast.expr]]) -> list[str]:
    """The sources of `tree` with one node replaced by one of `rewrite(node)`'s expressions, node by node in
    source order. Each replacement is undone once unparsed: `tree` is left as it was given. `rewrite` builds
    new nodes (which may hold the node it is given) and changes none."""
    slots, out = _slots(tree), []
    for node in _nodes(tree):
        for new in rewrite(node):
            _put(slots[id(node)], new)
            try:
                out.append(ast.unparse(tree))
            finally:
                _put(slots[id(node)], node)
    return out


def _call(name: str, args: Sequence[ast.expr], **keywords: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(name, ast.Load()), list(args), [ast.keyword(k, v) for k, v in keywords.items()])


def _is_call(node: ast.AST, *names: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def _is_int(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _plain_args(node: ast.Call) -> bool:
    """No `*` arguments: the positions of a call's arguments are known."""
    return not any(isinstance(arg, ast.Starred) for arg in node.args)


def _top_k(node: ast.Call) -> ast.expr | None:
    """The top_k a retrieval, rerank or fuse call gives, by keyword or by position (None when none)."""
    keyword = next((k.value for k in node.keywords if k.arg == "top_k"), None)
    position = _TOP_K_POSITION.get(node.func.id)
    if keyword is None and position is not None and _plain_args(node) and len(node.args) > position:
        return node.args[position]
    return keyword


def _with_top_k(node: ast.Call, value: ast.expr) -> ast.Call:
    """`node` with its top_k set to `value` (where it gave it, or as a keyword)."""
    position = _TOP_K_POSITION.get(node.func.id)
    by_keyword = any(k.arg == "top_k" for k in node.keywords)
    if not by_keyword and position is not None and len(node.args) > position:
        args = [value if i == position else arg for i, arg in enumerate(node.args)]
        return ast.Call(node.func, args, node.keywords)
    keywords = [k for k in node.keywords if k.arg != "top_k"] + [ast.keyword("top_k", value)]
    return ast.Call(node.func, node.args, keywords)


def _show_argument(node: ast.AST) -> ast.expr | None:
    """What `show(x)` shows, when `node` is such a call and x is not one indexed item (a single Hit)."""
    if not (_is_call(node, "show") and len(node.args) == 1 and not node.keywords and _plain_args(node)):
        return None
    shown = node.args[0]
    if isinstance(shown, ast.Subscript) and not isinstance(shown.slice, ast.Slice):
        return None
    return shown


def _window(node: ast.expr) -> tuple[ast.expr, int, ast.expr | None] | None:
    """(docs, j, k) when `node` is `docs[j:k]` with a constant j (0 when left out) and no step; k is None
    for `docs[j:]`."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)):
        return None
    lower, upper, step = node.slice.lower, node.slice.upper, node.slice.step
    if step is not None or not (lower is None or _is_int(lower) and lower.value >= 0):
        return None
    return node.value, 0 if lower is None else lower.value, upper


def _head(node: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """(docs, k) when `node` is `docs[:k]` (or `docs[0:k]`)."""
    window = _window(node)
    if window is None or window[1] != 0 or window[2] is None:
        return None
    return window[0], window[2]


def _sliced(docs: ast.expr, upper: ast.expr | None, lower: int = 0) -> ast.Subscript:
    """`docs[lower:upper]`, written `docs[:upper]` when lower is 0."""
    return ast.Subscript(docs, ast.Slice(ast.Constant(lower) if lower else None, upper, None), ast.Load())


def _bound_strings(tree: ast.Module) -> dict[str, str]:
    """Names bound once in the whole program, by a top-level `name = "a string"`."""
    stores: dict[str, int] = {}
    for node in _nodes(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores[node.id] = stores.get(node.id, 0) + 1
    return {statement.targets[0].id: statement.value.value for statement in tree.body
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name) and stores[statement.targets[0].id] == 1
            and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)}


def _query_text(node: ast.Call, strings: dict[str, str]) -> str | None:
    """The text a retrieval call searches for, when it is a string literal or a name bound to one."""
    if not node.args or not _plain_args(node):
        return None
    query = node.args[0]
    if isinstance(query, ast.Constant) and isinstance(query.value, str):
        return query.value
    return strings.get(query.id) if isinstance(query, ast.Name) else None


def _sub_queries(text: str) -> list[tuple[str, ...]]:
    """The distinct splits of `text` by each of `SPLITS` into at least two distinct, non-empty parts."""
    splits = []
    for pattern in SPLITS:
        parts = tuple(dict.fromkeys(part.strip() for part in re.split(pattern, text, flags=re.IGNORECASE)))
        splits.append(tuple(part for part in parts if part))
    return [parts for parts in dict.fromkeys(splits) if len(parts) >= 2]


def _fused(calls: list[ast.Call], top_k: ast.expr | None) -> list[ast.expr]:
    """`fuse(*calls)`, and, when the calls gave a top_k, the fusion cut to it (as many docs as one call)."""
    return [_call("fuse", calls)] + ([_call("fuse", calls, top_k=top_k)] if top_k is not None else [])


# The edits.

def change_top_k(tree: ast.Module) -> list[str]:
    """Each integer top_k of a retrieval, fuse or rerank call (a retrieval's default, 10, when it gives none)
    halved, doubled, and set to each of `TOP_K_VALUES`."""
    def rewrite(node: ast.AST) -> list[ast.expr]:
        if not _is_call(node, *SDK_FUNCTIONS):
            return []
        top_k = _top_k(node)
        if top_k is None and node.func.id in RETRIEVALS and len(node.args) == 1 and _plain_args(node):
            value = DEFAULT_TOP_K
        elif _is_int(top_k):
            value = top_k.value
        else:
            return []
        values = dict.fromkeys((value // 2, 2 * value, *TOP_K_VALUES))
        return [_with_top_k(node, ast.Constant(v)) for v in values if v >= 1 and v != value]
    return _variants(tree, rewrite)


def swap_retriever(tree: ast.Module) -> list[str]:
    """One sparse_retrieval call made a dense_retrieval call, or the other way round."""
    def rewrite(node: ast.AST) -> list[ast.expr]:
        if not _is_call(node, *RETRIEVALS):
            return []
        return [ast.Call(ast.Name(OTHER_RETRIEVAL[node.func.id], ast.Load()), node.args, node.keywords)]
    return _variants(tree, rewrite)


def add_fuse(tree: ast.Module) -> list[str]:
    """One retrieval call, not already fused, fused with the same call to the other retriever:
    `fuse(sparse_retrieval(q, k), dense_retrieval(q, k))`, and that fusion cut to k."""
    fused = {id(arg) for node in _nodes(tree) if _is_call(node, "fuse") for arg in node.args}

    def rewrite(node: ast.AST) -> list[ast.expr]:
        if not _is_call(node, *RETRIEVALS) or id(node) in fused:
            return []
        other = ast.Call(ast.Name(OTHER_RETRIEVAL[node.func.id], ast.Load()), node.args, node.keywords)
        return _fused([node, other], _top_k(node))
    return _variants(tree, rewrite)


def add_dedup(tree: ast.Module) -> list[str]:
    """What one `show` shows deduplicated: `show(dedup(docs))`, or `show(dedup(docs)[:k])` for a slice
    (as many docs, none repeated). Skips lists that fuse or dedup already made."""
    def rewrite(node: ast.AST) -> list[ast.expr]:
        shown = _show_argument(node)
        if shown is None:
            return []
        head = _head(shown)
        docs = shown if head is None else head[0]
        if _is_call(docs, "dedup", "fuse"):
            return []
        deduped = _call("dedup", [docs])
        return [_call("show", [deduped if head is None else _sliced(deduped, head[1])])]
    return _variants(tree, rewrite)


def add_rerank(tree: ast.Module) -> list[str]:
    """What one `show` shows reranked for the program's first literal query: `show(rerank(q, docs))`, or
    `show(rerank(q, docs, top_k=k))` for `show(docs[:k])` (the k best of all docs, not of the first k)."""
    strings = _bound_strings(tree)
    queries = [node.args[0] for node in _nodes(tree)
               if _is_call(node, *RETRIEVALS) and _query_text(node, strings) is not None]

    def rewrite(node: ast.AST) -> list[ast.expr]:
        shown = _show_argument(node)
        if shown is None or not queries:
            return []
        head = _head(shown)
        docs = shown if head is None else head[0]
        if _is_call(docs, "rerank"):
            return []
        top_k = {} if head is None else {"top_k": head[1]}
        return [_call("show", [_call("rerank", [queries[0], docs], **top_k)])]
    return _variants(tree, rewrite)


def split_query(tree: ast.Module) -> list[str]:
    """One retrieval of a literal query split into sub-queries (per clause, per "and"-separated part, and
    both), one retrieval each with the same top_k, fused (and cut to that top_k)."""
    strings = _bound_strings(tree)

    def rewrite(node: ast.AST) -> list[ast.expr]:
        text = _query_text(node, strings) if _is_call(node, *RETRIEVALS) else None
        if text is None:
            return []
        return [fused for parts in _sub_queries(text) for fused in _fused(
            [ast.Call(node.func, [ast.Constant(part), *node.args[1:]], node.keywords) for part in parts],
            _top_k(node))]
    return _variants(tree, rewrite)


def resize_shown(tree: ast.Module) -> list[str]:
    """What one `show` shows widened, narrowed or moved down the ranking. A window `docs[j:k]` (j may be 0)
    ends at k - 1, k + 1, k // 2 or 2k, starts one later (the first shown dropped), moves down or up by one,
    or becomes all of docs; a whole list is cut to each of `SHOW_SIZES`, or loses its first document."""
    def rewrite(node: ast.AST) -> list[ast.expr]:
        shown = _show_argument(node)
        if shown is None:
            return []
        window = _window(shown)
        if window is None:
            return [_call("show", [_sliced(shown, ast.Constant(size))]) for size in SHOW_SIZES] + [
                _call("show", [_sliced(shown, None, 1)])]
        docs, j, upper = window
        if upper is not None and not _is_int(upper):
            return [_call("show", [docs])]
        if upper is None:
            windows = [(j + 1, None)] + ([(j - 1, None)] if j > 1 else [])  # docs[0:] is all of docs
        else:
            k = upper.value
            ends = [(j, end) for end in dict.fromkeys((k - 1, k + 1, k // 2, 2 * k)) if end > j and end != k]
            windows = ends + [(j + 1, k), (j + 1, k + 1)] + ([(j - 1, k - 1)] if j else [])
        resized = [_call("show", [_sliced(docs, None if end is None else ast.Constant(end), start)])
                   for start, end in dict.fromkeys(windows) if end is None or start < end]
        return resized + [_call("show", [docs])]
    return _variants(tree, rewrite)


EDITS: dict[str, Edit] = {
    "top_k": change_top_k, "swap_retriever": swap_retriever, "add_fuse": add_fuse, "add_dedup": add_dedup,
    "add_rerank": add_rerank, "split_query": split_query, "resize_shown": resize_shown}


# Mutation, verification, distillation.

def _sdk_calls(tree: ast.AST) -> set[str]:
    return {node.func.id for node in _nodes(tree) if _is_call(node, *SDK_FUNCTIONS)}


def _take_turns(lists: list[list[Mutation]]) -> list[Mutation]:
    """The first item of each list, then the second of each (of those that have one), ..."""
    return [items[i] for i in range(max(map(len, lists), default=0)) for items in lists if i < len(items)]


def mutations(source: str, available: Sequence[str] = SDK_FUNCTIONS, max_variants: int | None = None,
              limits: Limits | None = None) -> list[Mutation]:
    """Every single-edit variant of `source` that parses under `limits` and calls only `available` SDK
    functions, without repeats or the program itself; the edits take turns (the first variant of each edit
    in `EDITS` order, then the second of each, ...), so that `max_variants` keeps every kind. A program that
    does not parse has none."""
    limits = limits or Limits()
    try:
        tree = parse(source, limits).tree
    except ProgramError:
        return []
    candidates = _take_turns([[Mutation(variant, name) for variant in edit(tree)]
                              for name, edit in EDITS.items()])
    seen = {source, ast.unparse(tree)}
    out = []
    for candidate in candidates:
        if len(out) == max_variants:
            break
        if candidate.source in seen:
            continue
        seen.add(candidate.source)
        try:
            checked = parse(candidate.source, limits).tree
        except ProgramError:
            continue
        if _sdk_calls(checked) <= set(available):
            out.append(candidate)
    return out


def mutate(source: str, available: Sequence[str] = SDK_FUNCTIONS, max_variants: int | None = None,
           limits: Limits | None = None) -> list[str]:
    """The sources of `mutations(...)`."""
    return [mutation.source for mutation in mutations(source, available, max_variants, limits)]


def verify(source: str, variants: Sequence[Mutation], sdk: RetrievalSDK, score: Score,
           limits: Limits | None = None, max_shown: int | None = None,
           baseline: float | None = None) -> list[Verified]:
    """Runs `source` and each variant in the sandbox; keeps the variants that finish without error, show at
    most `max_shown` documents (the context budget; only the sandbox's limit when None) and score strictly
    above the original (which is scored as it ran, error or not; `baseline` is that score when the caller
    already has it, and `source` is then not run). Best first; ties keep `variants` order."""
    if baseline is None:
        baseline = score(execute(source, sdk, limits))
    out = []
    for variant in variants:
        result = execute(variant.source, sdk, limits)
        if result.error is None and (max_shown is None or len(result.shown) <= max_shown):
            value = score(result)
            if value > baseline:
                out.append(Verified(variant.source, value, baseline, len(result.shown), variant.edit))
    return sorted(out, key=lambda verified: -verified.score)


def climb(source: str, sdk: RetrievalSDK, score: Score, available: Sequence[str] = SDK_FUNCTIONS,
          max_variants: int | None = None, limits: Limits | None = None, max_shown: int | None = None, *,
          rounds: int, baseline: float | None = None) -> list[Verified]:
    """Local search by verified edits: the best verified variant of `source` (`mutations`, then `verify`),
    then the best verified variant of that one, and so on for at most `rounds` rounds, stopping at the first
    round that verifies none. Returns that path, one `Verified` per round (each scored against the last), so
    a change of several coordinated edits is reached one improvement at a time; empty when none verifies.
    `baseline` is `source`'s score when the caller has it; each later round reuses the last variant's."""
    path: list[Verified] = []
    for _ in range(rounds):
        current, known = (path[-1].source, path[-1].score) if path else (source, baseline)
        better = verify(current, mutations(current, available, max_variants, limits), sdk, score, limits,
                        max_shown, known)
        if not better:
            break
        path.append(better[0])
    return path
