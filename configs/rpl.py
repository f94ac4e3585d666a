"""Retrieval Program Learning: the policy writes programs over the retrieval SDK, run in the sandbox.

Usage: python -m searchrl.main --config configs/rpl.py:PRESET[,SPACE][,no_thinking] train [--config.x.y=...]
Presets:
  tiny            CPU smoke runs and tests (a random tiny model; point tokenizer, data and index at local
                  files).
  paper_qwen3_4b  Qwen3-4B, open-domain QA (NQ + HotpotQA) and GlobalQA, BM25 + e5 dense, the full SDK.
  paper_qwen3_8b  the same with Qwen3-8B.
SPACE, the action space (the paper's Table 4 rows): dense | dual | sdk (default) | pm (sdk plus program
mutation at step 200, config.mutation).
no_thinking: Qwen3's chat template with enable_thinking=False.
The RPL paper gives no training hyper-parameters: the paper presets use the Search-R1 PPO defaults the other
paper presets use ([R1] Search-R1's train_ppo.sh, as in configs/search_r1.py:paper), each cited below.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # config files import their siblings

import search_r1  # noqa: E402

from searchrl import run_config  # noqa: E402
from searchrl.configlib import to_config  # noqa: E402
from searchrl.envs.program import ACTION_SPACES  # noqa: E402
from searchrl.rl.config import MutationConfig  # noqa: E402

VARIANTS = (*ACTION_SPACES, "pm", "no_thinking")  # ",<variant>" suffixes of a preset


def _paper(config, preset: str, path: str):
    config = search_r1.paper(config)  # Search-R1's PPO, optimizer, KL and batch settings [R1]
    config.env = run_config.envs.default_config("program")
    config.model.update(dict(preset=preset, path=path))
    config.data.update(dict(train="nq,hotpotqa,globalqa", eval="nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,"
                                                               "musique,bamboogle,globalqa"))
    config.retrieval.index_dir = "/data/indexes/wiki18_bm25"  # sparse_retrieval
    config.env.dense_index_dir = "/data/indexes/wiki18_e5_flat"  # dense_retrieval; rerank falls back to e5
    config.env.max_turns = 4  # program turns, as Search-R1's four search turns [R1]
    config.env.chat_template = True  # Qwen3 is prompted through its chat template;
    config.env.enable_thinking = True  # its thinking switch (",no_thinking" turns it off)
    config.mutation.sft.max_len = config.rollout.max_prompt_tokens + config.rollout.max_turn_tokens
    return config


def paper_qwen3_4b(config):
    return _paper(config, "qwen3_4b", "/data/models/Qwen3-4B")


def paper_qwen3_8b(config):
    return _paper(config, "qwen3_8b", "/data/models/Qwen3-8B")


def tiny(config):
    """A random tiny model on CPU; set tokenizer, data and index paths on the command line."""
    config.env = run_config.envs.default_config("program")
    config.model.preset = "tiny"
    config.env.update(dict(max_turns=1))
    config.env.limits.update(dict(max_shown=5, max_retrieval_calls=4, max_docs_retrieved=200))
    config.rollout.update(dict(max_prompt_tokens=256, max_turn_tokens=48, max_obs_tokens=128,
                               obs_buckets=(64, 128), max_len=256 + 2 * 48 + 128, chunk_steps=16))
    config.train.update(dict(steps=10, batch_size=8))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=8))
    config.rl.actor.lr = config.rl.critic.lr = 1e-4
    return config


PRESETS = {"tiny": tiny, "paper_qwen3_4b": paper_qwen3_4b, "paper_qwen3_8b": paper_qwen3_8b}


def get_config(arg: str = "tiny"):
    preset, *options = arg.split(",")
    spaces = [o for o in options if o in (*ACTION_SPACES, "pm")]
    if preset not in PRESETS or len(spaces) > 1 or set(options) - set(VARIANTS):
        raise ValueError(f"Unknown preset {arg!r} for configs/rpl.py; expected one of {sorted(PRESETS)}, "
                         f"optionally followed by ',<action space>' (one of {sorted(ACTION_SPACES)} or pm) "
                         "and ',no_thinking'")
    config = run_config.experiment_config("program")
    config.mutation = to_config(MutationConfig())
    config = PRESETS[preset](config)
    if spaces:
        config.env.action_space = "sdk" if spaces[0] == "pm" else spaces[0]
    if "pm" in spaces:
        config.mutation.at_step = 200  # mutation at step 200, then RL resumes [the RPL paper]
    if "no_thinking" in options:
        config.env.enable_thinking = False
    return config
