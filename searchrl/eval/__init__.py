"""searchrl.eval: greedy evaluation of any task's policy (`harness`) with the metrics its env reports, and the
report (`report`): the papers' table, tables by the task's groups, accuracy by search budget and the task's own
analyses (`searchrl.task.Report`).

Library use (demos, notebooks): `harness.evaluate_policy(...)`, then `report.write_report(results, out_dir)`;
command line: `python -m searchrl.eval --config ... --checkpoint ...` (see `searchrl.eval.__main__`).
"""
