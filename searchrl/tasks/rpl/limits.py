"""What one Retrieval Program Learning program may spend: the sandbox's limits and their defaults."""
from __future__ import annotations

from searchrl.configlib import group, ranged


@group
class Limits:
    """Every bound the language and the sandbox enforce. A program that reaches one stops with an error that
    names it (e.g. "step limit: ...", "docs limit: ...") and where it was reached.

    Sizes are checked before a value is built, so a program can never allocate more than these allow:
    `"x" * 10**9`, `[0] * 10**9` and `range(10**12)` fail without building anything.
    """

    # Checked when the program is parsed.
    max_source_chars: int = ranged(20_000, "[1, inf)")  # program text
    # nesting of the syntax tree (a comprehension's `for` clauses count as levels)
    max_depth: int = ranged(50, "[1, inf)")
    # Checked while it runs.
    # node evaluations, plus one per value a call or comparison is given
    max_steps: int = ranged(100_000, "[1, inf)")
    max_seconds: float = ranged(5.0, "(0, inf)")  # wall time, retrieval included
    max_int: int = ranged(2**63 - 1, "[1, inf)")  # largest |int| a literal or a result may have
    max_str_len: int = ranged(10_000, "[1, inf)")  # characters in one string
    # values in one list (nested lists' values included), tuple, set or range
    max_items: int = ranged(10_000, "[1, inf)")
    # lists and tuples inside lists and tuples (a set inside counts one level)
    max_nesting: int = ranged(10, "[1, inf)")
    # items and characters of every list, tuple, set and string created, in all
    max_alloc: int = ranged(1_000_000, "[1, inf)")
    max_retrieval_calls: int = ranged(16, "[0, inf)")  # sparse_retrieval, dense_retrieval and rerank calls
    # top_k summed over sparse_retrieval and dense_retrieval calls
    max_docs_retrieved: int = ranged(1_000, "[0, inf)")
    max_rerank_docs: int = ranged(100, "[0, inf)")  # docs one rerank call may score
    max_shown: int = ranged(10, "[0, inf)")  # hits `show` may put into the model's context, in all
