"""`make demo`: `python -m searchrl.demo [--config configs/autosearch.py:tiny] [--config.train.steps=...]`
runs the miniature of the config's task: AutoSearch (`search_qa`, `searchrl.demo.autosearch`), DeepRetrieval
(`query_rewrite`, `configs/deepretrieval.py:tiny`, `searchrl.demo.rewrite`) or Retrieval Program Learning
(`program`, `configs/rpl.py:tiny`, `searchrl.demo.rpl`)."""
from absl import app, logging
from ml_collections import config_flags

from searchrl.demo import autosearch, rewrite, rpl

_CONFIG = config_flags.DEFINE_config_file("config", "configs/autosearch.py:tiny", "Demo config.")
DEMOS = {"search_qa": autosearch.run, "query_rewrite": rewrite.run, "program": rpl.run}


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}")
    name = _CONFIG.value.env.name
    if name not in DEMOS:
        raise app.UsageError(f"No demo for config.env.name={name!r}; demos: {sorted(DEMOS)}")
    logging.set_verbosity(logging.WARNING)  # progress bars and the final table, not every checkpoint file
    DEMOS[name](_CONFIG.value)


if __name__ == "__main__":
    app.run(main)
