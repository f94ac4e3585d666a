"""Search-R1: PPO with the format-aware EM reward over a top-k retriever; the baseline the other configs build on.

Usage: python -m searchrl.main --config configs/search_r1.py:PRESET COMMAND [--config.x.y=value ...]
Presets:
  tiny   CPU smoke runs and tests (a random tiny model; set tokenizer, data and index paths on the command line).
  paper  Search-R1 v0.2 (Jin et al. 2025), Qwen2.5-3B base, NQ + HotpotQA, e5 over Wikipedia-2018.
Sources cited below: [R1] Search-R1's train_ppo.sh, [P] the Search-R1 paper (arXiv 2503.09516),
[A] the AutoSearch paper's reproduction of this baseline (its §4.1 setup).
"""
from searchrl import run_config


def paper(config):
    """The published Search-R1 PPO setup; model, data and index paths are local directories you provide."""
    config.model.preset = "qwen2p5_3b"
    config.model.path = "/data/models/Qwen2.5-3B"  # base (not instruct) model [P §4.1]
    config.model.param_dtype = "bfloat16"
    config.data.dir = "/data/flashrag"  # FlashRAG files: <dataset>/{train,test}.jsonl
    config.data.train = "nq,hotpotqa"  # merged NQ + HotpotQA training set [P §4.1]
    config.retrieval.index_dir = "/data/indexes/wiki18_e5_flat"  # e5-base-v2 over Wikipedia-2018 [P §4.1]
    config.env.reward = "search_r1"
    config.env.topk = 3  # retriever.topk=3 [R1]
    config.env.max_turns = 4  # four search turns [A]
    config.rollout.update(dict(
        max_prompt_tokens=4096,  # data.max_prompt_length=4096 [R1]
        max_turn_tokens=500,  # data.max_response_length=500 [R1]
        max_obs_tokens=500,  # data.max_obs_length=500 [R1]
        obs_buckets=(128, 256, 500),
        max_len=4096 + 5 * 500 + 4 * 500,
    ))
    config.rollout.sampling.temperature = 1.0  # actor_rollout_ref.rollout.temperature=1 [R1]
    config.train.update(dict(steps=1005, batch_size=512, checkpoint_every=100, eval_every=50))  # [R1]
    rl = config.rl
    rl.advantage, rl.gamma, rl.lam = "gae", 1.0, 1.0  # algorithm.adv_estimator=gae, gamma=lam=1 [R1]
    rl.minibatch_size, rl.micro_batch_size = 256, 64  # ppo_mini_batch_size=256, ppo_micro_batch_size=64 [R1]
    rl.actor.lr = 1e-6  # actor_rollout_ref.actor.optim.lr=1e-6 [R1]
    rl.actor.warmup_steps = 286  # lr_warmup_steps_ratio=0.285 of 1005 steps [R1]
    rl.critic.lr = 1e-5  # critic.optim.lr=1e-5 [R1]
    rl.critic.warmup_steps = 15  # critic lr_warmup_steps_ratio=0.015 [R1]
    rl.use_reference = True
    rl.kl_loss_coef = 0.001  # actor.kl_loss_coef=0.001 [R1]
    rl.kl_loss_type = "low_var_kl"  # actor.kl_loss_type=low_var_kl [R1]
    rl.clip_ratio_low = rl.clip_ratio_high = 0.2  # verl default clip_ratio=0.2 [R1]
    rl.entropy_coef = 0.001  # entropy coefficient 0.001 [A]
    rl.compute_dtype = "bfloat16"
    rl.remat = True  # enable_gradient_checkpointing=true [R1]
    config.mesh.update(dict(data=1, fsdp=-1, tensor=1))  # FSDP over the host's GPUs, as verl [R1]
    return config


def paper_grpo(config):
    """[P] Table 3's GRPO variant: 5 responses per prompt, group-normalised outcome advantages, no critic."""
    config = paper(config)
    config.rl.advantage = "grpo"
    config.rl.responses_per_prompt = 5  # actor_rollout_ref.rollout.n_agent=5 [R1 train_grpo.sh]
    config.rl.use_critic = False
    config.rl.whiten_advantages = False  # GRPO advantages are already normalised per group
    return config


def tiny(config):
    """A random tiny model on CPU; point tokenizer/data/retrieval at local files with --config.* flags."""
    config.model.preset = "tiny"
    config.env.max_turns = 2
    config.rollout.update(dict(max_prompt_tokens=128, max_len=512, max_turn_tokens=48, max_obs_tokens=96,
                               obs_buckets=(32, 96), chunk_steps=16))
    config.train.update(dict(steps=10, batch_size=8))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=4))
    config.rl.actor.lr = 1e-4
    config.rl.critic.lr = 1e-4
    return config


PRESETS = {"tiny": tiny, "paper": paper, "paper_grpo": paper_grpo}


def get_config(arg: str = "tiny"):
    if arg not in PRESETS:
        raise ValueError(f"Unknown preset {arg!r} for configs/search_r1.py; expected one of {sorted(PRESETS)}")
    return PRESETS[arg](run_config.experiment_config())
