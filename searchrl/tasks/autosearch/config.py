"""`config.demo` of the AutoSearch miniature (no JAX here: building a config stays instant)."""
from __future__ import annotations

import dataclasses

from searchrl.rl.config import SFTConfig
from searchrl.tasks.autosearch.rewards import RewardConfig


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """The synthetic world, the scripted cold start and the evaluation of the AutoSearch demo."""

    entities: int = 4000
    questions_per_entity: float = 2.0
    hop_fractions: tuple[float, ...] = (0.5, 0.3, 0.2)  # of 1-, 2- and 3-hop questions
    vocab_size: int = 1200  # of the BPE tokenizer trained on the world
    extra_search_fraction: float = 0.7  # scripted trajectories that search once more than needed
    early_answer_fraction: float = 0.3  # of those, the ones that also practise the answer before that search
    eval_questions: int = 384  # of the test split, every policy's figures and claims
    budgets: tuple[int, ...] = (0, 1, 2, 3)  # search budgets of the accuracy-vs-budget curve
    budget_questions: int = 384  # of those, the first this many in each budget's run (one evaluation each)
    prefix_sft: SFTConfig = SFTConfig()  # the first cold-start stage, on two-turn prefixes
    seeds: tuple[int, ...] = (0,)  # whole runs (world, model, cold start, RL arms), one per seed
    parallel_seeds: int = 1  # seeds run side by side, each in a process of its own (results.run_seeds)
    # RL arms, each trained from its seed's cold start (`demo.ARMS`): "autosearch" (config.env.autosearch),
    # "no_efficiency" (its efficiency terms off), "step_penalty" (those off, `step_penalty` per search).
    arms: tuple[str, ...] = ("autosearch",)
    # The "step_penalty" arm's cost per search turn (RewardConfig.search_step_penalty); by default what
    # AutoSearch charges an unneeded search.
    step_penalty: float = RewardConfig().efficiency_overshoot_penalty
