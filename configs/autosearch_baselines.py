"""AutoSearch's RL baselines, StepSearch and HiPRAG, as rewards on AutoSearch's own run: the model, data,
search env and learner of configs/autosearch.py, with the baseline's reward
(searchrl/tasks/autosearch/baseline_rewards.py gives each formula and where it differs from its source).

Usage: python -m searchrl.main --config configs/autosearch_baselines.py:PRESET[,SETUP] train [--config.x=...]
       python -m searchrl.demo --config configs/autosearch_baselines.py:tiny_stepsearch
Presets:
  paper_stepsearch   configs/autosearch.py:paper with StepSearch's reward (PPO: token-level step rewards).
  paper_hiprag       configs/autosearch.py:paper with HiPRAG's reward.
  paper_hiprag_grpo  the same under GRPO (configs/autosearch.py:paper_grpo).
  tiny_stepsearch, tiny_hiprag
                     the CPU miniature (configs/autosearch.py:tiny) with the baseline's reward.
StepSearch's information gain and search-key terms read gold data from each question's metadata
(`support_docs` texts or `supporting_ids`, and `search_keys`): StepSearch's MuSiQue-derived training set has
them (its parquet's ground_truth.search_keys and extra_info.support_docs, which the Search-R1 parquet reader
keeps), NQ + HotpotQA do not, and without them only the answer's F1 is left.
The baselines' own runs differ from AutoSearch's in what the reward does not decide: StepSearch trained on
that set with max_turns=5 and lr 5e-7 ([SS] train.sh), HiPRAG on Qwen2.5-Instruct models with its `<step>`
prompt.
Sources: [SS] github.com/Zillwang/StepSearch: train.sh, verl/trainer/main_ppo.py (RewardManager),
verl/utils/reward_score/qa_step.py; [HP] github.com/qualidea1217/HiPRAG: scripts/nq_hotpotqa/v0.3/
train_ppo_format.sh, verl/utils/reward_score/qa_em_format.py (compute_score_em, search_r1_format).
"""
from searchrl import run_config
from searchrl.configlib import sibling

autosearch = sibling(__file__, "autosearch")
hardware = sibling(__file__, "hardware")


def _stepsearch(config):
    config.env.reward = "stepsearch"
    config.env.stepsearch.update(dict(
        step_reward_scale=0.6,  # RewardManager(..., step_reward_scale=0.6), built without it [SS main_ppo.py]
        information_gain_coef=1.0,  # trainer.information_gain=true [SS train.sh]
        redundancy_coef=1.0,  # trainer.redundancy_penalty=true [SS train.sh]
        # search_keys_score=0.618 [SS qa_step.py], on with trainer.search_key_reward=true [SS train.sh]
        search_key_coef=0.618,
        format_penalty=-1.0,  # 'score': -1 without a final answer (answer_last_check) [SS qa_step.py]
    ))
    return config


def _hiprag(config):
    config.env.reward = "hiprag"  # reads the intermediate answers config.env samples by default
    config.env.hiprag.update(dict(
        format_weight=0.2,  # lambda_f: reward_model.structure_format_score=0.2 [HP train_ppo_format.sh]
        process_coef=0.4,  # lambda_p: the 0.4 of compute_score_em [HP qa_em_format.py]
    ))
    return config


def paper_stepsearch(config):
    config = _stepsearch(autosearch.paper(config))
    # StepSearch reads no intermediate answer: none is sampled (an evaluation that wants AutoSearch's depth
    # analysis sets --config.env.intermediate_answers=true).
    config.env.intermediate_answers = False
    # Without them every row fits at its largest (64 a GPU x 663 pages: 23 GiB): no pool of AutoSearch's size.
    config.rollout.pool_pages = 0
    return config


def paper_hiprag(config):
    return _hiprag(autosearch.paper(config))


def paper_hiprag_grpo(config):
    """HiPRAG's reward under GRPO: one score per response, as HiPRAG's GRPO runs."""
    return _hiprag(autosearch.paper_grpo(config))


def _tiny(config, name: str):
    """configs/autosearch.py:tiny in a workdir of its own (runs/demo_<name>)."""
    config = autosearch.tiny(config)
    config.workdir = f"runs/demo_{name}"  # the world's paths follow it (configlib.miniature_workdir)
    return config


def tiny_stepsearch(config):
    """The miniature with StepSearch's reward: the synthetic world's questions carry their gold passages' ids
    (metadata.supporting_ids) and one search per hop (metadata.plan), read as the search keys."""
    config = _stepsearch(_tiny(config, "stepsearch"))
    config.env.stepsearch.search_keys_field = "plan"
    return config


def tiny_hiprag(config):
    return _hiprag(_tiny(config, "hiprag"))


PRESETS = {"paper_stepsearch": paper_stepsearch, "paper_hiprag": paper_hiprag,
           "paper_hiprag_grpo": paper_hiprag_grpo, "tiny_stepsearch": tiny_stepsearch,
           "tiny_hiprag": tiny_hiprag}

# The hardware setups (configs/hardware.py) the docs recommend for the paper presets, by the preset's model:
# 8 A100s or H100s, or 8 TPU v5p chips (compiled ahead of time by `python -m searchrl.benchmarks.aot_setups`).
PAPER_SETUPS = {"qwen2p5_3b": ("a100x8", "h100x8", "v5p8")}


def get_config(arg: str = "tiny_stepsearch"):
    preset, setup = hardware.split(arg)
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {arg!r} for configs/autosearch_baselines.py; expected one of "
                         f"{sorted(PRESETS)}, optionally followed by ',<setup>' ({sorted(hardware.SETUPS)})")
    config = hardware.apply(PRESETS[preset](run_config.experiment_config("autosearch")), setup)
    return run_config.preset_workdir(config, __file__, preset)
