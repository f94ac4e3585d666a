"""DeepRetrieval's runtime comparison (its 34x of BM25 over dense), end to end: `searchrl.benchmarks.retrieval`
with the queries first rewritten by a chat endpoint (e.g. a vLLM server of a trained policy) given the public
MS MARCO prompt, then retrieved by BM25 and by dense over the same passages.

  python -m searchrl.tasks.deepretrieval.end_to_end --passages 100000 --dense_passages 5000 \
      --api_base_url http://127.0.0.1:8000 --api_model deepretrieval-msmarco

Without --api_base_url the rewrite is the query itself and the row says so (retrieval only).
"""
from __future__ import annotations

from typing import Sequence

from absl import flags

from searchrl import cli
from searchrl.benchmarks import retrieval
from searchrl.eval import chat_api
from searchrl.tasks.deepretrieval import api_rewrites, prompts
from searchrl.tasks.deepretrieval.env import plain_text
from searchrl.text import chat


def chat_rewriter(api: chat_api.ChatAPIConfig) -> retrieval.Rewrite:
    """Queries rewritten by a chat endpoint: DeepRetrieval's public MS MARCO prompt (`api_rewrites`' layout),
    its answer read as the public post-processing reads it."""
    generate, template = chat_api.ChatGenerate(chat_api.ChatClient(api)), prompts.PROMPTS["classic", True]

    def rewrite(queries: list[str]) -> list[str]:
        texts = generate([chat.messages("", plain_text("", prompts.fill(
            template.user, {"question": q}), template.assistant)) for q in queries], ())
        return [api_rewrites.api_value(text, "query")[0] or q for text, q in zip(texts, queries)]
    return rewrite


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    run_and_print = retrieval.define_flags(values)
    api_flags = chat_api.define_flags(values)
    cli.parse(values, argv, __doc__)
    api = chat_api.config_from_flags(api_flags)
    run_and_print(chat_rewriter(api) if api else None)


if __name__ == "__main__":
    cli.run(main)
