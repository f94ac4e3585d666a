"""Building a run from its config: a new model takes its tokenizer's vocabulary and special ids."""
from __future__ import annotations

from searchrl import experiment, run_config
from searchrl.text.tokenizer import PROTOCOL_TAGS, train_bpe_tokenizer


def test_a_new_policy_uses_the_tokenizers_special_ids():
    tokenizer = train_bpe_tokenizer(["alpha beta gamma delta"] * 20, vocab_size=280)
    config = run_config.experiment_config("search_r1")
    config.model.preset = "tiny"  # the preset's own ids (eos 2) would collide with the protocol tags here
    cfg, params = experiment.load_policy(run_config.parse(config).model, 0, tokenizer)
    assert cfg.vocab_size == len(tokenizer) == params["embed"].shape[0]
    assert cfg.eos_token_id == tokenizer.eos_token_id
    assert cfg.eos_token_id not in tokenizer.convert_tokens_to_ids(list(PROTOCOL_TAGS))
    config.model.vocab_size = 300
    assert experiment.load_policy(run_config.parse(config).model, 0, tokenizer)[0].vocab_size == 300
