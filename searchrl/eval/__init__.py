"""searchrl.eval: greedy evaluation of search agents, the papers' tables, AutoSearch's search-depth analysis.

Library use (the trainer, notebooks): `evaluate_policy(...)`, then `write_report(results, out_dir)`;
command line: `python -m searchrl.eval --config ... --checkpoint ...` (see `searchrl.eval.__main__`).
"""
from searchrl.eval.harness import (DEFAULT_ANSWER_PROMPT, evaluate_checkpoint, evaluate_policy,
                                   load_checkpoint, minimal_sufficient_depth, question_rows)
from searchrl.eval.report import aggregate, markdown, write_report

__all__ = ["DEFAULT_ANSWER_PROMPT", "evaluate_checkpoint", "evaluate_policy", "load_checkpoint",
           "minimal_sufficient_depth", "question_rows", "aggregate", "markdown", "write_report"]
