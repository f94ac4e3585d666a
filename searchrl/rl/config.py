"""The RL groups of an experiment config: `config.train` (the host loop), `config.rl` (the learn step) and
`config.sft` (the cold start), with the optimizer of each model. No JAX here, so that building a config stays
instant; `searchrl.rl.ppo` turns `RLConfig` into its static, hashable `PPOConfig`.
"""
from __future__ import annotations

import dataclasses
import math

from searchrl.configlib import group, ranged
from searchrl.rl.kl_controllers import KL_CONTROLLERS

DECAYS = ("constant", "cosine", "linear")
LOGGERS = ("console", "tensorboard", "wandb")  # where a run's metrics go besides <workdir>/metrics.jsonl
MOMENT_DTYPES = ("", "float32", "bfloat16")


@group
class OptimConfig:
    """One model's optimizer: AdamW with global-norm clipping and a warmup (+ constant, cosine or linear)
    schedule."""

    lr: float = ranged(allowed="[0, inf)")  # peak learning rate (the papers: actor 1e-6, critic 1e-5)
    warmup_steps: int = ranged(0, "[0, inf)")  # linear warmup from 0 over this many training iterations
    # after warmup: "constant", or "cosine" / "linear" down to min_lr_ratio * lr at decay_steps
    decay: str = "constant"
    # cosine and linear: iteration at which the rate reaches its floor (warmup included); SFT only: 0 is the
    # run's last step (`SFTConfig.schedule`)
    decay_steps: int = ranged(0, "[0, inf)")
    min_lr_ratio: float = ranged(0.0, "[0, 1]")
    weight_decay: float = ranged(0.01, "[0, inf)")  # decoupled (AdamW), on every parameter as torch's AdamW
    b1: float = ranged(0.9, "[0, 1)")
    b2: float = ranged(0.999, "[0, 1)")
    eps: float = ranged(1e-8, "(0, inf)")
    clip_grad_norm: float = ranged(1.0, "[0, inf)")  # global-norm clipping threshold; 0 disables
    # The dtype Adam's first moment is kept in between steps (optax's mu_dtype; "": the params'). verl keeps
    # it in float32; "bfloat16" halves it where the float32 state does not fit (configs/hardware.py): each
    # step decays it in bfloat16 and adds the gradient's share in float32, and the update is float32.
    mu_dtype: str = ""

    def __post_init__(self):
        if self.decay not in DECAYS:
            raise ValueError(f"optimizer decay {self.decay!r} is not one of {DECAYS}")
        if self.mu_dtype not in MOMENT_DTYPES:
            raise ValueError(f"optimizer mu_dtype {self.mu_dtype!r} is not one of {MOMENT_DTYPES}")
        if self.decay != "constant" and 0 < self.decay_steps <= self.warmup_steps:
            raise ValueError(f"{self.decay} decay needs decay_steps ({self.decay_steps}) > warmup_steps "
                             f"({self.warmup_steps})")


@group
class TrainConfig:
    """`config.train`: the host loop's schedule."""

    steps: int = ranged(100, "[1, inf)")  # RL iterations (when epochs is 0)
    # > 0: run this many passes over the training questions instead, verl's trainer.total_epochs: each pass is
    # training questions // batch_size iterations (its train dataloader drops the last partial batch; searchrl
    # makes as many updates, its data order running on across epoch boundaries).
    epochs: int = ranged(0, "[0, inf)")
    batch_size: int = ranged(8, "[1, inf)")  # prompts per iteration (x rl.responses_per_prompt rows)
    log_every: int = ranged(1, "[1, inf)")
    eval_every: int = ranged(0, "[0, inf)")  # 0: no evaluation during training
    eval_batches: int = ranged(1, "[1, inf)")
    checkpoint_every: int = ranged(10, "[1, inf)")  # and the last step: a run always ends with a checkpoint
    keep_checkpoints: int = ranged(3, "[1, inf)")
    async_checkpoints: bool = True
    # this many non-finite (skipped) updates in a row stop the run with an error
    max_nonfinite_steps: int = ranged(3, "[1, inf)")
    # Where metrics go besides metrics.jsonl, some of LOGGERS, in verl's trainer.logger spelling too:
    # "console,wandb" or "[console,wandb]". console: the progress line; wandb: WANDB_MODE (e.g. offline) and
    # the other WANDB_* variables apply.
    logger: str = "console,tensorboard"
    project: str = "searchrl"  # the W&B project (verl's trainer.project_name); the run is named after its workdir
    progress_every_s: float = ranged(30.0, "(0, inf)")  # not on a terminal (SLURM, nohup): a line this often

    def __post_init__(self):
        if unknown := [name for name in self.loggers if name not in LOGGERS]:
            raise ValueError(f"train.logger: unknown logger(s) {unknown}; known: {list(LOGGERS)}")

    @property
    def loggers(self) -> tuple[str, ...]:
        """`logger` as names: "[console, wandb]", "console,wandb" -> ("console", "wandb")."""
        names = self.logger.strip().removeprefix("[").removesuffix("]").split(",")
        return tuple(name.strip().strip("'\"") for name in names if name.strip())

    def num_steps(self, questions: int) -> int:
        """`steps`, or with `epochs` set, epochs x (questions // batch_size): verl's total_training_steps
        (len(train_dataloader) * total_epochs, the dataloader with drop_last=True)."""
        if not self.epochs:
            return self.steps
        if questions < self.batch_size:
            raise ValueError(f"train.epochs={self.epochs} over {questions} training questions: fewer than one "
                             f"batch of train.batch_size={self.batch_size}")
        return self.epochs * (questions // self.batch_size)


@group
class RLConfig:
    """`config.rl`: one learn step (scoring, KL, advantages, PPO epochs), with verl's defaults."""

    # Advantages: a name in searchrl.rl.advantages.ADVANTAGES, and the options of the estimators.
    advantage: str = "gae"
    gamma: float = ranged(1.0, "[0, 1]")  # gae, reinforce_plus_plus, gigpo (per step)
    lam: float = ranged(1.0, "[0, 1]")  # gae
    grpo_eps: float = ranged(1e-6, "(0, inf)")  # grpo, gigpo
    grpo_norm_by_std: bool = True  # grpo, gigpo (False: Dr.GRPO; gigpo's mean_norm)
    # gigpo: omega, the step advantage's weight (GiGPO's Eq. 8 and scripts: 1)
    gigpo_step_weight: float = ranged(1.0, "[0, inf)")
    whiten_advantages: bool = True  # masked whitening over the batch (verl's GAE does this)
    # > 1: group sampling for GRPO / RLOO (groups keyed by prompt)
    responses_per_prompt: int = ranged(1, "[1, inf)")
    # KL to the reference policy, in the reward (verl's algorithm.kl_ctrl) and / or as a loss.
    use_reference: bool = False  # needed by both
    kl_in_reward: bool = False  # subtract kl_coef * KL from the token rewards
    # verl's algorithm.kl_penalty: kl (k1, its default), abs, mse (k2) or low_var_kl (k3; searchrl.rl.kl).
    kl_reward_estimator: str = "kl"
    # > 0: clamp the per-token KL to [-clip, clip] first (AutoSearch: 5)
    kl_reward_clip: float = ranged(0.0, "[0, inf)")
    kl_controller: str = "fixed"  # a name in searchrl.rl.kl_controllers.KL_CONTROLLERS: fixed, adaptive
    kl_coef: float = ranged(0.001, "[0, inf)")
    kl_target: float = ranged(0.1, "(0, inf)")  # adaptive only
    kl_horizon: float = ranged(10000.0, "(0, inf)")  # adaptive only
    # > 0: add kl_loss_coef * KL(pi || ref) to the policy loss (GRPO)
    kl_loss_coef: float = ranged(0.0, "[0, inf)")
    kl_loss_type: str = "low_var_kl"
    # The update: PPO epochs over minibatches, gradient accumulation over micro-batches.
    ppo_epochs: int = ranged(1, "[1, inf)")
    minibatch_size: int = ranged(8, "[1, inf)")  # rows per optimizer step
    micro_batch_size: int = ranged(8, "[1, inf)")  # rows per forward/backward pass
    shuffle: bool = True  # False: minibatches in batch order, as verl's dp_actor (batch.split)
    # Pack each micro-batch's sequences whole into rows about the batch's width (`searchrl.rl.packing`), one
    # row a data-parallel shard a pass, as verl's remove-padding: the same update, without computing on
    # padding (nor, with blockwise attention, across sequences).
    pack: bool = True
    policy_loss: str = "ppo"  # a name in searchrl.rl.losses.POLICY_LOSSES
    clip_ratio_low: float = ranged(0.2, "[0, 1]")
    clip_ratio_high: float = ranged(0.2, "[0, inf)")  # > low: DAPO's clip-higher
    clip_ratio_c: float = ranged(3.0, "(1, inf)")  # dual clip (verl requires > 1)
    loss_agg_mode: str = "token-mean"  # searchrl.rl.losses.AGG_MODES
    # seq-mean-token-sum-norm's constant (0: the padded length S)
    loss_max_length: int = ranged(0, "[0, inf)")
    value_clip: float = ranged(0.5, "[0, inf)")
    entropy_coef: float = ranged(0.0, "[0, inf)")
    use_critic: bool = True  # False for critic-free estimators (GRPO, RLOO, REINFORCE++)
    compute_dtype: str = "float32"  # bfloat16 on accelerators: params are cast inside the loss
    remat: bool = False
    # > 0: log-probs from the LM head this many positions at a time (memory, not math): a chunk's float32
    # logits, 8 rows of 1,024 over Qwen's 151,936 words, are 4.6 GiB, the whole 8,548-token rows' 38.7 GiB
    logits_chunk: int = ranged(1024, "[0, inf)")
    # Keep the reference model in host memory (JAX's memory kinds), copied to the devices for the scoring
    # pass only: its params no longer take device memory through the PPO epochs.
    offload_reference: bool = False
    actor: OptimConfig = OptimConfig(lr=1e-6)
    critic: OptimConfig = OptimConfig(lr=1e-5)

    def __post_init__(self):
        if self.minibatch_size % self.micro_batch_size:
            raise ValueError(f"rl.minibatch_size={self.minibatch_size} is not a multiple of "
                             f"rl.micro_batch_size={self.micro_batch_size}")
        for name, optim in (("actor", self.actor), ("critic", self.critic)):
            if optim.decay != "constant" and not optim.decay_steps:  # only SFT derives it from its data
                raise ValueError(f"rl.{name}.decay={optim.decay!r} needs rl.{name}.decay_steps > "
                                 f"rl.{name}.warmup_steps ({optim.warmup_steps})")
        KL_CONTROLLERS.get(self.kl_controller, "rl.kl_controller")  # known even where kl_in_reward is off
        if (self.kl_in_reward or self.kl_loss_coef > 0) and not self.use_reference:
            raise ValueError("rl.kl_in_reward and rl.kl_loss_coef > 0 need a reference policy: set "
                             "rl.use_reference=True.")


def batch_rows(train: TrainConfig, rl: RLConfig) -> int:
    """Rows of a training batch, and so of its rollout: train.batch_size x rl.responses_per_prompt."""
    return train.batch_size * rl.responses_per_prompt


@group
class SFTConfig:
    """`config.sft`: supervised fine-tuning steps (or epochs), batch, optimizer and per-epoch checkpoints."""

    # seeded random minibatches (each drawn without replacement), when `epochs` is 0
    steps: int = ranged(200, "[1, inf)")
    epochs: float = ranged(0.0, "[0, inf)")  # > 0: this many shuffled passes over the examples, not `steps`
    # with `epochs`: `main sft` also saves these at <workdir>/sft/epoch_N
    save_epochs: tuple[int, ...] = ranged((), "[1, inf)")
    batch_size: int = ranged(32, "[1, inf)")
    max_len: int = ranged(512, "[1, inf)")
    seed: int = ranged(0, "[0, inf)")
    # A decay with decay_steps=0 ends at the run's last step (trl's SFTTrainer: linear over all epochs).
    optim: OptimConfig = OptimConfig(lr=1e-3, warmup_steps=20)

    def __post_init__(self):
        wrong = [n for n in self.save_epochs if not 1 <= n <= self.epochs or n != int(n)]
        if wrong:
            raise ValueError(f"sft.save_epochs={self.save_epochs}: epochs {wrong} do not end within "
                             f"sft.epochs={self.epochs} (whole epochs from 1).")

    def steps_per_epoch(self, examples: int) -> int:
        """Minibatches of one pass over `examples` (the last one filled up with empty rows)."""
        return math.ceil(examples / self.batch_size)

    def num_steps(self, examples: int) -> int:
        """`steps`, or with `epochs` set, the steps that many passes over `examples` take."""
        return math.ceil(self.epochs * self.steps_per_epoch(examples)) if self.epochs > 0 else self.steps

    def schedule(self, examples: int) -> OptimConfig:
        """`optim`, its decay ending at the run's last step where `optim.decay_steps` is 0."""
        if self.optim.decay == "constant" or self.optim.decay_steps:
            return self.optim
        return dataclasses.replace(self.optim, decay_steps=self.num_steps(examples))
