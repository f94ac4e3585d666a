"""AutoSearch: Search-R1's PPO plus turn-level rewards for format, answer-quality gains of the intermediate answers
and stopping at the minimal sufficient search depth.

Usage: python -m searchrl.main --config configs/autosearch.py:PRESET train [--config.x.y=value ...]
       python -m searchrl.demo  [--config configs/autosearch.py:tiny]
Presets:
  tiny                 the CPU demo: a synthetic world, BM25, a tiny model, SFT cold start then PPO.
  tiny_no_efficiency   the demo's ablation: the efficiency reward off (AutoSearch's ablation in miniature).
  paper                AutoSearch on Qwen2.5-3B base (the Search-R1 setup it builds on, see search_r1.py:paper).
  paper_grpo           the same with GRPO (5 responses per prompt), no critic.
Sources cited below: [AS] the AutoSearch paper's §4.1 setup, [R1] Search-R1's train_ppo.sh.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # config files import their siblings

import search_r1  # noqa: E402

from searchrl import run_config  # noqa: E402
from searchrl.configlib import to_config  # noqa: E402
from searchrl.demo.config import DemoConfig  # noqa: E402

DEMO_PROMPT = "Question: {question}\n"
# The demo's intermediate answers open the way its scripted answer turns do
# (searchrl.demo.scripted.answer_turn; the demo checks that they agree).
DEMO_ANSWER_PROMPT = "<think> I can answer. </think><answer>"


def _autosearch(config):
    config.env.reward = "autosearch"
    config.env.intermediate_answers = True  # an intermediate answer after every search step [AS]
    return config


def paper(config):
    config = _autosearch(search_r1.paper(config))
    config.env.max_turns = 4  # up to four search turns [AS]
    config.rollout.max_turn_tokens = 500  # response 500 tokens per turn [AS]
    config.rollout.max_obs_tokens = 800  # observation 800 tokens [AS]
    config.rollout.obs_buckets = (200, 400, 800)
    config.rollout.max_len = 4096 + 5 * 500 + 4 * 800
    return config


def paper_grpo(config):
    config = paper(config)
    config.rl.advantage = "grpo"
    config.rl.responses_per_prompt = 5  # 5 responses per prompt [AS, R1 train_grpo.sh]
    config.rl.use_critic = False
    config.rl.whiten_advantages = False
    return config


def tiny(config):
    """The demo: every size here is chosen so that install + world + SFT + PPO + evaluation fit ~20 minutes on
    2 CPU cores."""
    config = _autosearch(config)
    config.workdir = "runs/demo"
    config.demo = to_config(DemoConfig())
    config.demo.extra_search_fraction = 0.7  # the scripted SFT data over-searches on 70% of questions
    # ... and practises the answer before that extra search on 30% of those (scripted.early_answers): at 0 a
    # policy stopping early answered worse (EM -2 to -5 points); at 1 the direct answer was the better one and
    # PPO stopped early even without the efficiency reward (the ablation lost its effect).
    config.demo.early_answer_fraction = 0.3
    model = config.model
    model.preset = "tiny"
    model.update(dict(hidden_size=128, intermediate_size=384, num_layers=3, num_heads=4, num_kv_heads=2,
                      head_dim=32, tie_word_embeddings=True))
    config.tokenizer = os.path.join(config.workdir, "tokenizer")
    config.data.dir = config.workdir
    config.data.train, config.data.eval = "world", "world"
    config.data.eval_split = "test"
    config.retrieval.index_dir = os.path.join(config.workdir, "index")
    # The world's plan queries find their passage at BM25 rank 1, so one passage per search is enough.
    config.env.update(dict(prompt_template=DEMO_PROMPT, topk=1, max_turns=4, answer_prompt=DEMO_ANSWER_PROMPT,
                           intermediate_answer_tokens=12))
    config.rollout.update(dict(max_prompt_tokens=40, max_turn_tokens=32, max_obs_tokens=64, obs_buckets=(32, 64),
                               max_len=40 + 5 * 32 + 4 * 64, chunk_steps=32))
    config.rollout.sampling.temperature = 1.0
    # The cold start trains first on two-turn prefixes (scripted.turn_prefixes): a third of a trajectory's
    # tokens, yet both copies a search agent makes (question -> query, passage -> answer or next query). Without
    # that stage the tiny model memorises the training subjects instead of learning to copy unseen ones.
    config.demo.prefix_sft.update(dict(steps=300, batch_size=64, max_len=160))
    config.demo.prefix_sft.optim.update(dict(lr=3e-3, warmup_steps=20, decay="cosine", decay_steps=300,
                                             min_lr_ratio=0.1))
    config.sft.update(dict(steps=250, batch_size=32, max_len=config.rollout.max_len))
    config.sft.optim.update(dict(lr=3e-3, warmup_steps=20, decay="cosine", decay_steps=250, min_lr_ratio=0.1))
    config.train.update(dict(steps=40, batch_size=32, checkpoint_every=20, eval_every=0))
    # A 40-step run sees each decision a few hundred times, not a thousand steps' worth: the overshoot penalty
    # is raised from 0.05 so that one unneeded search costs clearly more than the noise of a turn's reward.
    config.env.autosearch.efficiency_overshoot_penalty = 0.25
    rl = config.rl
    rl.update(dict(advantage="gae", gamma=1.0, lam=1.0, minibatch_size=32, micro_batch_size=32, ppo_epochs=1,
                   use_reference=True, kl_loss_coef=0.001, kl_loss_type="low_var_kl", entropy_coef=0.0))
    # Adam moves every weight by about lr per step, signal or not: at 2e-4 the tiny policy's copying of names
    # degraded (EM -2.5 to -5 points); 1e-4 keeps it within about 2 points across seeds.
    rl.actor.update(dict(lr=1e-4, warmup_steps=0))
    rl.critic.update(dict(lr=1e-3, warmup_steps=0))
    return config


def tiny_no_efficiency(config):
    config = tiny(config)
    config.workdir = "runs/demo_no_efficiency"
    config.tokenizer = os.path.join(config.workdir, "tokenizer")
    config.data.dir = config.workdir
    config.retrieval.index_dir = os.path.join(config.workdir, "index")
    config.env.autosearch.efficiency_budget = 0.0
    config.env.autosearch.efficiency_step_cost = 0.0
    config.env.autosearch.efficiency_overshoot_penalty = 0.0
    config.env.autosearch.efficiency_wrong_answer_reward = 0.0
    return config


PRESETS = {"tiny": tiny, "tiny_no_efficiency": tiny_no_efficiency, "paper": paper, "paper_grpo": paper_grpo}


def get_config(arg: str = "tiny"):
    if arg not in PRESETS:
        raise ValueError(f"Unknown preset {arg!r} for configs/autosearch.py; expected one of {sorted(PRESETS)}")
    return PRESETS[arg](run_config.experiment_config())
