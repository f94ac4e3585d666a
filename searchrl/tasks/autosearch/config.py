"""`config.demo` of the AutoSearch miniature (no JAX here: building a config stays instant)."""
from __future__ import annotations

from searchrl.configlib import group, ranged
from searchrl.rl.config import SFTConfig
from searchrl.tasks.autosearch.rewards import RewardConfig

ARMS = ("autosearch", "no_efficiency", "step_penalty")  # the RL arms a miniature may train (`demo.ARMS`)


@group
class DemoConfig:
    """The synthetic world, the scripted cold start and the evaluation of the AutoSearch demo."""

    entities: int = ranged(4000, "[1, inf)")
    questions_per_entity: float = ranged(2.0, "(0, inf)")
    hop_fractions: tuple[float, ...] = ranged((0.5, 0.3, 0.2), "[0, 1]")  # of 1-, 2- and 3-hop questions
    vocab_size: int = ranged(1200, "[1, inf)")  # of the BPE tokenizer trained on the world
    # scripted trajectories that search once more than needed
    extra_search_fraction: float = ranged(0.7, "[0, 1]")
    # of those, the ones that also practise the answer before that search
    early_answer_fraction: float = ranged(0.3, "[0, 1]")
    eval_questions: int = ranged(384, "[1, inf)")  # of the test split, every policy's figures and claims
    budgets: tuple[int, ...] = ranged((0, 1, 2, 3), "[0, inf)")  # search budgets of the accuracy curve
    # of those, the first this many in each budget's run (one evaluation each)
    budget_questions: int = ranged(384, "[1, inf)")
    prefix_sft: SFTConfig = SFTConfig()  # the first cold-start stage, on two-turn prefixes
    # whole runs (world, model, cold start, RL arms), one per seed
    seeds: tuple[int, ...] = ranged((0,), "[0, inf)")
    # seeds run side by side, each in a process of its own (results.run_seeds)
    parallel_seeds: int = ranged(1, "[1, inf)")
    # RL arms, each trained from its seed's cold start (`demo.ARMS`): "autosearch" (config.env.autosearch),
    # "no_efficiency" (its efficiency terms off), "step_penalty" (those off, `step_penalty` per search).
    arms: tuple[str, ...] = ("autosearch",)
    # The "step_penalty" arm's cost per search turn (RewardConfig.search_step_penalty); by default what
    # AutoSearch charges an unneeded search.
    step_penalty: float = ranged(RewardConfig().efficiency_overshoot_penalty, "(-inf, inf)")

    def __post_init__(self):
        if unknown := [arm for arm in self.arms if arm not in ARMS]:  # fails before any seed runs
            raise ValueError(f"arms: unknown {unknown}; expected some of {list(ARMS)}")
