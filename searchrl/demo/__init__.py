"""searchrl.demo: the CPU miniatures. `python -m searchrl.demo` runs the miniature of the config's task (its
`searchrl.task.Task.demo`); the synthetic world no model can know (`synthetic`) is theirs to share, and
`config` gives a miniature's per-seed and world-file configs."""
