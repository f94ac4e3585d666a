"""A deterministic in-memory SDK for program tests, and the invariants every program result must keep."""
from __future__ import annotations

import re
from typing import Any

from searchrl.retrieval.types import Hit
from searchrl.tasks.rpl import language, sandbox
from searchrl.tasks.rpl.language import RULES
from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.sandbox import ProgramResult, execute
from searchrl.tasks.rpl.sdk import SDK_FUNCTIONS, RetrievalSDK

ERROR = re.compile(r"(?P<rule>[a-z ]+): (?P<detail>.*) \(line (?P<line>\d+), column (?P<column>\d+)\)",
                   re.DOTALL)


class FakeRetriever:
    """Hits "<name>:<query>:<rank>", scored k - rank."""

    def __init__(self, name: str):
        self.name = name

    def search(self, queries, k):
        return [[Hit(f"{self.name}:{q}:{r}", float(k - r), f"title {r}", f"{q} passage {r}")
                 for r in range(k)] for q in queries]


class ReversingReranker:
    def rerank(self, query, docs, top_k=None):
        return [Hit(d.id, float(i), d.title, d.text) for i, d in enumerate(docs)][::-1][:top_k]


SDK = RetrievalSDK(sparse=FakeRetriever("s"), dense=FakeRetriever("d"), reranker=ReversingReranker(), rrf_k=1)


def run(source: str, **limits) -> ProgramResult:
    """`source` run on the fake SDK, under the default limits with `limits` replaced."""
    return execute(source, SDK, Limits(**limits))


def ids(result: ProgramResult) -> list[str]:
    return [hit.id for hit in result.shown]


def variables(source: str, **limits) -> dict[str, Any]:
    """The variables `source` leaves, read through the sandbox's internals; its error is raised."""
    limits = Limits(**limits)
    interpreter = sandbox._Interpreter(language.parse(source, limits), SDK, limits, ProgramResult())
    interpreter.run()
    return interpreter.variables


def check_result(result: ProgramResult, limits: Limits) -> None:
    """What holds for every program, however hostile: a well-formed error naming a known rule, and every
    counter within its limit."""
    assert isinstance(result, ProgramResult)
    if result.error is not None:
        match = ERROR.fullmatch(result.error)
        assert match and match["rule"] in RULES, result.error
        assert int(match["line"]) >= 1 and int(match["column"]) >= 1
    else:
        assert result.steps <= limits.max_steps
    assert all(isinstance(hit, Hit) for hit in result.shown) and len(result.shown) <= limits.max_shown
    assert result.retrieval_calls <= limits.max_retrieval_calls
    assert result.docs_retrieved <= limits.max_docs_retrieved
    assert result.primitives <= set(SDK_FUNCTIONS)
