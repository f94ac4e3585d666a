"""searchrl.eval: greedy evaluation of any environment's policy with the metrics the env reports, the papers'
tables, accuracy by search budget and AutoSearch's search-depth analysis; AutoSearch's pilot study at forced
search depth (`pilot`, `forced_depth`) and the prompting baselines Direct, CoT, RAG, IRCoT, Search-o1
(`baselines`, `prompts`).

Library use (the trainer, notebooks): `evaluate_policy(...)`, then `write_report(results, out_dir)`;
command line: `python -m searchrl.eval --config ... --checkpoint ...` (see `searchrl.eval.__main__`).
"""
from searchrl.eval.harness import evaluate_checkpoint, evaluate_policy, question_rows
from searchrl.eval.report import aggregate, markdown, write_report

__all__ = ["evaluate_checkpoint", "evaluate_policy", "question_rows", "aggregate", "markdown", "write_report"]
