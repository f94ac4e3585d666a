"""Search-R1: PPO with an outcome EM reward over a top-k retriever; the baseline every other config builds on.

Usage: python -m searchrl.main --config configs/search_r1.py:tiny COMMAND [--config.x.y=value ...]
Presets: `tiny` (CPU, tests and smoke runs).
"""
from searchrl import configlib


def get_config(arg: str = "tiny"):
    config = configlib.base_config()
    if arg == "tiny":
        config.model.preset = "tiny"
        config.mesh.data = -1
    else:
        raise ValueError(f"Unknown preset {arg!r} for configs/search_r1.py; expected one of: tiny")
    return config
