"""searchrl.demo: the CPU miniatures. A task declares one (`searchrl.task.Demo`) and fills in its skeleton
(`miniature.Miniature`: world, cold start, arms, claims, report); `python -m searchrl.demo` runs the
config's task's, `reproduce` runs them over seeds and `publish` turns the record into the docs' figures. The
synthetic world no model can know (`synthetic`) is theirs to share, `config` gives a miniature's presets and
its per-seed and world-file configs, `results` the seeds' intervals, claims and results files."""
