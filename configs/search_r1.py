"""Search-R1: PPO with an EM reward over a top-k retriever; the baseline the other configs build on.

Usage: python -m searchrl.main --config configs/search_r1.py:PRESET[,SETUP] COMMAND [--config.x.y=value ...]
Presets:
  tiny        CPU smoke runs and tests (a random tiny model; set tokenizer, data and index paths on the
              command line).
  paper       Search-R1 v0.2 (the paper's run, arXiv 2503.09516): PPO, plain EM reward, Qwen2.5-3B base,
              NQ + HotpotQA, e5 over Wikipedia-2018.
  paper_7b    the same on Qwen2.5-7B base ([V2]'s active BASE_MODEL line).
  paper_v03   Search-R1 v0.3 (arXiv 2505.15117): the same PPO with the format-aware reward.
  paper_grpo  v0.2's GRPO run: 5 responses per prompt, KL as a loss, no critic.
Sources cited below, all in github.com/PeterGriffinJin/Search-R1: [V2] scripts/nq_hotpotqa/v0.2/train_ppo.sh,
[V3] scripts/nq_hotpotqa/v0.3/train_ppo_format.sh, [G2] scripts/nq_hotpotqa/v0.2/train_grpo.sh, [Y] the
defaults those scripts leave unset, verl/trainer/config/ppo_trainer.yaml, [T] the verl trainer code they run
(verl/trainer/ppo/ray_trainer.py, verl/workers/actor/dp_actor.py, search_r1/llm_agent/generation.py), and
[P] the Search-R1 paper (arXiv 2503.09516). (The repository's top-level train_ppo.sh is its quick start,
not a paper run: NQ only, Llama-3.2-3B, max_turns=2, rollout top_p left at [Y]'s 0.95.)
"""
from searchrl import run_config
from searchrl.configlib import sibling

hardware = sibling(__file__, "hardware")


def paper(config):
    """[V2]: the published Search-R1 PPO run; model, data and index paths are local directories you
    provide."""
    config.model.preset = "qwen2p5_3b"
    # BASE_MODEL='Qwen/Qwen2.5-3B', one of [V2]'s models (its active line is the 7B) [P §4.1]
    config.model.path = "/data/models/Qwen2.5-3B"
    config.model.param_dtype = "bfloat16"
    config.data.dir = "/data/flashrag"  # FlashRAG files: <dataset>/{train,test}.jsonl
    config.data.train = "nq,hotpotqa"  # data_name=nq_hotpotqa_train [V2]
    config.retrieval.index_dir = "/data/indexes/wiki18_e5_flat"  # e5-base-v2 over Wikipedia-2018 [P §4.1]
    config.env.reward = "em"  # main_ppo's reward: qa_em.compute_score_em with format_score=0 [V2, T]
    config.env.topk = 3  # retriever.topk=3 [V2]
    config.env.max_turns = 4  # max_turns=4 search turns, then one answer turn [V2, T generation.py]
    config.rollout.update(dict(
        max_prompt_tokens=2048,  # data.max_start_length=2048: the question's prompt [V2]
        max_turn_tokens=500,  # data.max_response_length=500 per turn [V2]
        max_obs_tokens=500,  # data.max_obs_length=500 [V2]
        obs_buckets=(128, 256, 500),
        # The longest sequence [V2] trains on: that prompt, then the turns and observations cut to their
        # first data.max_prompt_length=4096 tokens (generation.py _update_right_side [T]).
        max_len=2048 + 4096,
        # searchrl's own memory setting: one call of 512 prompts of 2,048 tokens materialises their attention
        # scores over every cache slot (AutoSearch's preset: 155 GiB a GPU on 8, `searchrl.benchmarks.aot`);
        # chunks of the widest observation bucket bound them by its width.
        chunked_prefill=True,
    ))
    config.rollout.sampling.temperature = 1.0  # actor_rollout_ref.rollout.temperature=1 [V2]
    config.rollout.sampling.top_p = 1.0  # actor_rollout_ref.rollout.top_p=1.0 [V2]
    # trainer.total_training_steps=1005, data.train_batch_size=512, save_freq=100, test_freq=100 [V2]
    config.train.update(dict(steps=1005, batch_size=512, checkpoint_every=100, eval_every=100))
    rl = config.rl
    rl.advantage = "gae"  # algorithm.adv_estimator=gae [V2]
    rl.gamma, rl.lam = 1.0, 1.0  # algorithm.gamma=1.0, algorithm.lam=1.0 [Y]
    rl.minibatch_size, rl.micro_batch_size = 256, 64  # ppo_mini_batch_size=256, ppo_micro_batch_size=64 [V2]
    rl.ppo_epochs = 1  # actor.ppo_epochs: 1 [Y]
    rl.shuffle = False  # minibatches in order: dp_actor.update_policy's batch.split [T]; shuffle: False [Y]
    rl.actor.lr = 1e-6  # actor_rollout_ref.actor.optim.lr=1e-6 [V2]
    rl.actor.warmup_steps = int(0.285 * 1005)  # lr_warmup_steps_ratio=0.285 of the 1005 steps [V2]
    rl.critic.lr = 1e-5  # critic.optim.lr=1e-5 [V2]
    rl.critic.warmup_steps = int(0.015 * 1005)  # critic.optim.lr_warmup_steps_ratio=0.015 [V2]
    rl.use_reference = True
    # KL in the reward, not as a loss: algorithm.kl_ctrl.kl_coef=0.001 [V2], kl_ctrl.type fixed and
    # kl_penalty kl (k1) [Y]; actor.use_kl_loss stays False [Y], so apply_kl_penalty runs [T ray_trainer.py].
    rl.kl_in_reward, rl.kl_coef, rl.kl_controller, rl.kl_reward_estimator = True, 0.001, "fixed", "kl"
    rl.kl_loss_coef = 0.0
    rl.clip_ratio_low = rl.clip_ratio_high = 0.2  # actor.clip_ratio: 0.2 [Y]
    rl.value_clip = 0.5  # critic.cliprange_value: 0.5 [Y]
    rl.entropy_coef = 0.001  # actor.entropy_coeff: 0.001 [Y]
    rl.compute_dtype = "bfloat16"
    rl.remat = True  # enable_gradient_checkpointing=true [V2]
    config.mesh.update(dict(data=1, fsdp=-1, tensor=1))  # FSDP over the host's GPUs, as verl [V2]
    return config


def paper_7b(config):
    """[V2] with its active model line: BASE_MODEL='Qwen/Qwen2.5-7B' [V2]."""
    config = paper(config)
    config.model.update(dict(preset="qwen2p5_7b", path="/data/models/Qwen2.5-7B"))
    # searchrl's own memory setting: every episode of the step decodes at once, its KV in a page pool sized
    # from the 60 GiB budget of an 80 GiB GPU, not from 64 rows a GPU x 8,192 slots (28 GiB). The train state
    # takes 22.3 GiB a GPU and the sampling weights 14.2 (docs/benchmarks.md): 20,480 pages of 16 slots, at
    # 0.875 MiB a page (28 layers x 4 key heads x 128 x 2 (keys, values) x 2 bytes x 16), take 17.5 GiB and
    # hold 5,120 slots a row on average; a row finding none free waits for an episode to end.
    config.rollout.pool_pages = 20480
    return config


def paper_v03(config):
    """[V3]: v0.2's PPO with qa_em_format's format-aware reward (retrieval reward off)."""
    config = paper(config)
    config.env.reward = "search_r1"  # python3 -m verl.trainer.main_ppo_format [V3]
    config.env.search_r1.update(dict(
        structure_format_score=0.2,  # reward_model.structure_format_score=0.2 [V3]
        final_format_score=0.1,  # reward_model.final_format_score=0.1 [V3]
        retrieval_score=0.0,  # reward_model.retrieval_score=0 [V3]
    ))
    return config


def grpo(config):
    """[G2]'s learner on `config`: 5 responses per prompt, group-normalised outcome advantages, KL as a loss,
    no critic (configs/autosearch.py:paper_grpo applies it too)."""
    config.rl.advantage = "grpo"  # algorithm.adv_estimator=grpo [G2]
    config.rl.responses_per_prompt = 5  # actor_rollout_ref.rollout.n_agent=5 [G2]
    config.rl.use_critic = False
    config.rl.whiten_advantages = False  # GRPO advantages are already normalised per group
    config.rl.kl_in_reward = False  # use_kl_loss=true: no KL in the reward [G2, T ray_trainer.py]
    config.rl.kl_loss_coef = 0.001  # actor_rollout_ref.actor.kl_loss_coef=0.001 [G2]
    config.rl.kl_loss_type = "low_var_kl"  # actor_rollout_ref.actor.kl_loss_type=low_var_kl [G2]
    return config


def paper_grpo(config):
    """[G2]: `paper` with GRPO's learner (`grpo`)."""
    config = grpo(paper(config))
    config.rollout.sampling.top_p = 0.95  # [G2] sets no rollout.top_p: rollout.top_p: 0.95 [Y]
    # searchrl's own memory setting: the 2,560 episodes of a step (320 a GPU) decode at once, their KV in a
    # page pool sized from the 60 GiB budget, not from every row at its largest (90 GiB). Beside the train
    # state (5.1 GiB a GPU, no critic) and the sampling weights (5.7), 65,536 pages of 16 slots, at 0.5625 MiB
    # a page (Qwen2.5-3B: 36 layers x 2 key heads x 128 x 2 (keys, values) x 2 bytes x 16), take 36 GiB and
    # hold 3,277 slots a row on average; a row finding none free waits for an episode to end.
    config.rollout.pool_pages = 65536
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


PRESETS = {"tiny": tiny, "paper": paper, "paper_7b": paper_7b, "paper_v03": paper_v03,
           "paper_grpo": paper_grpo}

# The hardware setups (configs/hardware.py) the docs recommend for the paper presets, by the preset's model:
# 8 A100s or H100s, the 7B on 8 H100s, all on 8 TPU v5p chips (compiled ahead of time by
# `python -m searchrl.benchmarks.aot_setups`).
PAPER_SETUPS = {"qwen2p5_3b": ("a100x8", "h100x8", "v5p8"), "qwen2p5_7b": ("h100x8", "v5p8")}


def get_config(arg: str = "tiny"):
    preset, setup = hardware.split(arg)
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {arg!r} for configs/search_r1.py; expected one of "
                         f"{sorted(PRESETS)}, optionally followed by ',<setup>' ({sorted(hardware.SETUPS)})")
    config = hardware.apply(PRESETS[preset](run_config.experiment_config("search_r1")), setup)
    return run_config.preset_workdir(config, __file__, preset)
