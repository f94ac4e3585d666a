"""The padded-FLOP benchmark on a tiny model: packing leaves little compute on padding."""
import os
import sys

from searchrl import run_config
from searchrl.benchmarks import padding

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "configs"))
import search_r1  # noqa: E402


def test_packed_step_computes_less_padding_than_the_padded_one():
    config = search_r1.get_config("tiny")
    config.rollout.update(dict(max_prompt_tokens=512, max_len=4096, max_turn_tokens=512, max_obs_tokens=512,
                                obs_buckets=(512,)))
    config.train.batch_size = 16
    config.mesh.update(dict(data=1, fsdp=1, tensor=1))  # one packed row a micro-batch
    r = padding.run(run_config.parse(config))
    assert r["tokens"] < r["rows"] * r["width"]
    assert 1.0 < r["packed_slot_ratio"] < r["padded_slot_ratio"]
    assert 1.0 < r["packed_ratio"] < r["padded_ratio"]
