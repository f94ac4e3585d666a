"""`make demo`: `python -m searchrl.demo [--config configs/autosearch.py:tiny] [--config.train.steps=...]`
runs the AutoSearch miniature (`searchrl.demo.autosearch`)."""
from absl import app, logging
from ml_collections import config_flags

from searchrl.demo import autosearch

_CONFIG = config_flags.DEFINE_config_file("config", "configs/autosearch.py:tiny", "Demo config.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # progress bars and the final table, not every checkpoint file
    autosearch.run(_CONFIG.value)


if __name__ == "__main__":
    app.run(main)
