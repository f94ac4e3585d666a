"""What one Retrieval Program Learning program may spend: the sandbox's limits and their defaults."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Limits:
    """Every bound the language and the sandbox enforce. A program that reaches one stops with an error that
    names it (e.g. "step limit: ...", "docs limit: ...") and where it was reached.

    Sizes are checked before a value is built, so a program can never allocate more than these allow:
    `"x" * 10**9`, `[0] * 10**9` and `range(10**12)` fail without building anything.
    """

    # Checked when the program is parsed.
    max_source_chars: int = 20_000  # program text
    max_depth: int = 50  # nesting of the syntax tree (a comprehension's `for` clauses count as levels)
    # Checked while it runs.
    max_steps: int = 100_000  # node evaluations, plus one per value a call or comparison is given
    max_seconds: float = 5.0  # wall time, retrieval included
    max_int: int = 2**63 - 1  # largest |int| a literal or a result may have
    max_str_len: int = 10_000  # characters in one string
    max_items: int = 10_000  # values in one list (nested lists' values included), tuple, set or range
    max_nesting: int = 10  # lists and tuples inside lists and tuples (a set inside counts one level)
    max_alloc: int = 1_000_000  # items and characters of every list, tuple, set and string created, in all
    max_retrieval_calls: int = 16  # sparse_retrieval, dense_retrieval and rerank calls
    max_docs_retrieved: int = 1_000  # top_k summed over sparse_retrieval and dense_retrieval calls
    max_rerank_docs: int = 100  # docs one rerank call may score
    max_shown: int = 10  # hits `show` may put into the model's context, in all
