"""The paper presets against the public runs they reproduce: every value below was read in the public file
named with it (github.com/PeterGriffinJin/Search-R1 and github.com/bofusun/AutoSearch)."""
import math
import os
import sys

import pytest

from searchrl.tasks.autosearch import rewards as au

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "configs"))

import autosearch  # noqa: E402
import deepretrieval  # noqa: E402
import hardware  # noqa: E402
import rpl  # noqa: E402
import search_r1  # noqa: E402

R1 = "PeterGriffinJin/Search-R1:"
V02_PPO = R1 + "scripts/nq_hotpotqa/v0.2/train_ppo.sh"
V03_PPO = R1 + "scripts/nq_hotpotqa/v0.3/train_ppo_format.sh"
V02_GRPO = R1 + "scripts/nq_hotpotqa/v0.2/train_grpo.sh"
R1_YAML = R1 + "verl/trainer/config/ppo_trainer.yaml"
R1_TRAINER = R1 + "verl/trainer/ppo/ray_trainer.py"
R1_ACTOR = R1 + "verl/workers/actor/dp_actor.py"
R1_WORKERS = R1 + "verl/workers/fsdp_workers.py"
R1_GAE = R1 + "verl/trainer/ppo/core_algos.py"
R1_MAIN = R1 + "verl/trainer/main_ppo.py"
R1_MAIN_FORMAT = R1 + "verl/trainer/main_ppo_format.py"
AS = "bofusun/AutoSearch:"
AS_SCRIPT = AS + "experiments/train_autosearch.sh"
AS_YAML = AS + "verl/trainer/config/ppo_trainer_tune.yaml"
AS_TRAINER = AS + "verl/trainer/ppo/ray_trainer_turn64.py"
AS_ACTOR = AS + "verl/workers/actor/dp_actor.py"
AS_REWARD = AS + "verl/trainer/main_ppo_format_turn_new78.py"
AS_SCORE = AS + "verl/utils/reward_score/qa_em_format_turn62.py"

# The PPO settings every PPO script sets the same way (v0.2, v0.3, AutoSearch): (setting, config key, value).
PPO_SCRIPT = [
    ("data.train_batch_size=512", "train.batch_size", 512),
    ("data.max_start_length=2048", "rollout.max_prompt_tokens", 2048),
    ("data.max_response_length=500", "rollout.max_turn_tokens", 500),
    ("algorithm.adv_estimator=gae", "rl.advantage", "gae"),
    ("actor_rollout_ref.actor.optim.lr=1e-6", "rl.actor.lr", 1e-6),
    ("actor.optim.lr_warmup_steps_ratio=0.285 of 1005 steps", "rl.actor.warmup_steps", int(0.285 * 1005)),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=256", "rl.minibatch_size", 256),
    ("actor_rollout_ref.actor.ppo_micro_batch_size=64", "rl.micro_batch_size", 64),
    ("actor_rollout_ref.rollout.n_agent=1", "rl.responses_per_prompt", 1),
    ("actor_rollout_ref.rollout.temperature=1", "rollout.sampling.temperature", 1.0),
    ("actor_rollout_ref.rollout.top_p=1.0", "rollout.sampling.top_p", 1.0),
    ("actor_rollout_ref.model.enable_gradient_checkpointing=true", "rl.remat", True),
    ("critic.optim.lr=1e-5", "rl.critic.lr", 1e-5),
    ("critic.optim.lr_warmup_steps_ratio=0.015 of 1005 steps", "rl.critic.warmup_steps", int(0.015 * 1005)),
    ("algorithm.kl_ctrl.kl_coef=0.001", "rl.kl_coef", 0.001),
    ("trainer.total_training_steps=1005", "train.steps", 1005),
    ("trainer.save_freq=100", "train.checkpoint_every", 100),
    ("trainer.test_freq=100", "train.eval_every", 100),
    ("max_turns=4", "env.max_turns", 4),
    ("retriever.topk=3", "env.topk", 3),
    ("data_name=nq_hotpotqa_train", "data.train", "nq,hotpotqa"),
]
# The defaults the scripts leave unset (ppo_trainer.yaml in Search-R1, ppo_trainer_tune.yaml in AutoSearch).
PPO_YAML = [
    ("algorithm.gamma: 1.0", "rl.gamma", 1.0),
    ("algorithm.lam: 1.0", "rl.lam", 1.0),
    ("algorithm.kl_ctrl.type: fixed", "rl.kl_controller", "fixed"),
    ("actor.use_kl_loss: False", "rl.kl_loss_coef", 0.0),
    ("actor.clip_ratio: 0.2", "rl.clip_ratio_low", 0.2),
    ("actor.clip_ratio: 0.2", "rl.clip_ratio_high", 0.2),
    ("actor.entropy_coeff: 0.001", "rl.entropy_coef", 0.001),
    ("actor.ppo_epochs: 1", "rl.ppo_epochs", 1),
    ("actor.shuffle: False", "rl.shuffle", False),
    ("actor.grad_clip: 1.0", "rl.actor.clip_grad_norm", 1.0),
    ("critic.grad_clip: 1.0", "rl.critic.clip_grad_norm", 1.0),
    ("critic.cliprange_value: 0.5", "rl.value_clip", 0.5),
    ("actor.optim.warmup_style: constant", "rl.actor.decay", "constant"),
]
VERL_CODE = [
    (R1_TRAINER, "not actor.use_kl_loss: apply_kl_penalty, KL off the rewards", "rl.kl_in_reward", True),
    (R1_ACTOR, "update_policy: dataloader = batch.split(ppo_mini_batch_size), in order", "rl.shuffle", False),
    (R1_GAE, "compute_gae_advantage_return: masked_whiten(advantages)", "rl.whiten_advantages", True),
    (R1_WORKERS, "AdamW betas (0.9, 0.999)", "rl.actor.b2", 0.999),
    (R1_WORKERS, "AdamW weight_decay 1e-2", "rl.actor.weight_decay", 0.01),
    (R1_WORKERS, "AdamW weight_decay 1e-2", "rl.critic.weight_decay", 0.01),
]


def _rows(source, rows):
    return [(source, *row) for row in rows]


SEARCH_R1_PPO = [
    *_rows(R1_YAML, [*PPO_YAML, ("algorithm.kl_penalty: kl", "rl.kl_reward_estimator", "kl")]),
    *VERL_CODE,
]
SEARCH_R1_V02 = [
    *_rows(V02_PPO, [*PPO_SCRIPT,
                     ("data.max_obs_length=500", "rollout.max_obs_tokens", 500),
                     ("data.max_start_length=2048 + data.max_prompt_length=4096", "rollout.max_len",
                      2048 + 4096),
                     ("BASE_MODEL='Qwen/Qwen2.5-3B' (one of its lines)", "model.preset", "qwen2p5_3b")]),
    (R1_MAIN, "qa_em.compute_score_em, format_score=0: plain EM", "env.reward", "em"),
    *SEARCH_R1_PPO,
]
SEARCH_R1_V03 = [
    *[(V03_PPO if source == V02_PPO else source, *row) for source, *row in SEARCH_R1_V02
      if row[1] != "env.reward"],
    (R1_MAIN_FORMAT, "qa_em_format.compute_score_em", "env.reward", "search_r1"),
    *_rows(V03_PPO, [("reward_model.structure_format_score=0.2", "env.search_r1.structure_format_score", 0.2),
                     ("reward_model.final_format_score=0.1", "env.search_r1.final_format_score", 0.1),
                     ("reward_model.retrieval_score=0", "env.search_r1.retrieval_score", 0.0)]),
]
SEARCH_R1_GRPO = [
    *_rows(V02_GRPO, [
        ("algorithm.adv_estimator=grpo", "rl.advantage", "grpo"),
        ("actor_rollout_ref.rollout.n_agent=5", "rl.responses_per_prompt", 5),
        ("actor_rollout_ref.actor.use_kl_loss=true", "rl.kl_in_reward", False),
        ("actor_rollout_ref.actor.kl_loss_coef=0.001", "rl.kl_loss_coef", 0.001),
        ("actor_rollout_ref.actor.kl_loss_type=low_var_kl", "rl.kl_loss_type", "low_var_kl"),
        ("data.train_batch_size=512", "train.batch_size", 512),
        ("actor_rollout_ref.actor.optim.lr=1e-6", "rl.actor.lr", 1e-6),
        ("max_turns=4", "env.max_turns", 4),
    ]),
    (R1_YAML, "rollout.top_p: 0.95 (the GRPO script sets none)", "rollout.sampling.top_p", 0.95),
    (R1_TRAINER, "adv_estimator == 'grpo': use_critic = False", "rl.use_critic", False),
]
AUTOSEARCH_REWARD = [
    (AS_SCORE, "structure_format_score / 8 (structure_format_score=0.2 in the script)",
     "env.autosearch.search_format_reward", 0.2 / 8),
    (AS_SCRIPT, "reward_model.final_format_score=0.1", "env.autosearch.answer_format_reward", 0.1),
    (AS_SCORE, "step_scores[-1] = -0.5 for a malformed answer turn", "env.autosearch.answer_format_penalty",
     -0.5),
    (AS_SCORE, "compute_score_em(score=1.)", "env.autosearch.correct_answer_reward", 1.0),
    (AS_SCORE, "is_repeat_part: sim_score > 0.8", "env.autosearch.redundancy_threshold", 0.8),
    (AS_REWARD, "reward_tensor[pos] += f1_score_gain", "env.autosearch.quality_coef", 1.0),
    (AS_REWARD, "0.5 * (0.4 / (early_correct_turn + 1) - 0.05)", "env.autosearch.efficiency_budget", 0.2),
    (AS_REWARD, "0.5 * (0.4 / (early_correct_turn + 1) - 0.05)", "env.autosearch.efficiency_step_cost",
     0.025),
    (AS_REWARD, "reward_tensor[pos] = -0.05 after the early-correct turn",
     "env.autosearch.efficiency_overshoot_penalty", 0.05),
    (AS_REWARD, "reward_tensor[pos] += 0.0125 when the answer is wrong",
     "env.autosearch.efficiency_wrong_answer_reward", 0.0125),
]
# How the intermediate answers are elicited: RewardManager.__call__ and generate_extra_outputs_for_qa_em.
AUTOSEARCH_ANSWERS = [
    (AS_REWARD, "answer_prompt: its own ChatML prompt, question + trajectory so far (lines 421-438)",
     "env.intermediate_answer_mode", "public_prompt"),
    (AS_REWARD, "generate_extra_outputs_for_qa_em(temperature=1.0) (line 510)",
     "env.intermediate_answer_sampling.temperature", 1.0),
    (AS_REWARD, "generate_extra_outputs_for_qa_em: top_p: float = 0.9 (line 193)",
     "env.intermediate_answer_sampling.top_p", 0.9),
    (AS_REWARD, "generate_extra_outputs_for_qa_em: top_k: int = 50 (line 194)",
     "env.intermediate_answer_sampling.top_k", 50),
    (AS_SCRIPT, "data.max_response_length=500: vLLM's max_tokens (rollout.response_length in the yaml)",
     "env.intermediate_answer_tokens", 500),
]
AUTOSEARCH_PPO = [
    *_rows(AS_SCRIPT, [*PPO_SCRIPT,
                       ("data.max_obs_length=800", "rollout.max_obs_tokens", 800),
                       ("data.max_start_length=2048 + data.max_prompt_length=6500", "rollout.max_len",
                        2048 + 6500),
                       ("BASE_MODEL=.../Qwen2.5-3B", "model.preset", "qwen2p5_3b"),
                       ('algorithm.kl_penalty="low_var_kl"', "rl.kl_reward_estimator", "low_var_kl")]),
    *_rows(AS_YAML, PPO_YAML),
    (AS_TRAINER, "not actor.use_kl_loss: apply_kl_penalty", "rl.kl_in_reward", True),
    (AS_TRAINER, "apply_kl_penalty: kld = torch.clamp(kld, min=-5, max=5)", "rl.kl_reward_clip", 5.0),
    (AS_ACTOR, "update_policy: batch.split(ppo_mini_batch_size), in order", "rl.shuffle", False),
    (AS_REWARD, "RewardManager: turn-level rewards with intermediate answers", "env.reward", "autosearch"),
    *AUTOSEARCH_REWARD,
    *AUTOSEARCH_ANSWERS,
]
PUBLIC_RUNS = {
    (search_r1, "paper"): SEARCH_R1_V02,
    (search_r1, "paper_v03"): SEARCH_R1_V03,
    (search_r1, "paper_grpo"): SEARCH_R1_GRPO,
    (autosearch, "paper"): [*AUTOSEARCH_PPO, (AS_REWARD, "(the paper's reward, not the code's)",
                                              "env.autosearch.public_code", False)],
    (autosearch, "paper_public_reward"): [*AUTOSEARCH_PPO, (AS_REWARD, "RewardManager.__call__, as coded",
                                                            "env.autosearch.public_code", True)],
    (autosearch, "paper_grpo"): [row for row in SEARCH_R1_GRPO if row[0] != R1_YAML],
}


def value(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def same(actual, expected) -> bool:
    if isinstance(expected, float):
        return isinstance(actual, (int, float)) and math.isclose(actual, expected, rel_tol=1e-12)
    return type(actual) is type(expected) and actual == expected


@pytest.mark.parametrize("module,preset", list(PUBLIC_RUNS), ids=lambda p: getattr(p, "__name__", p))
def test_preset_matches_the_public_run(module, preset):
    config = module.get_config(preset)
    wrong = [f"{key}={value(config, key)!r}, but {source} has {setting} -> {expected!r}"
             for source, setting, key, expected in PUBLIC_RUNS[module, preset]
             if not same(value(config, key), expected)]
    assert not wrong, "\n".join(wrong)


def test_the_demo_keeps_the_greedy_continuation_for_intermediate_answers():
    env = autosearch.get_config("tiny").env
    assert env.intermediate_answer_mode == "continuation" and env.intermediate_answer_sampling.temperature == 0


@pytest.mark.parametrize("module", [search_r1, autosearch], ids=lambda m: m.__name__)
def test_kl_is_a_loss_in_grpo_presets_and_in_the_reward_in_ppo_presets(module):
    for name in (n for n in module.PRESETS if n.startswith("paper")):
        rl = module.get_config(name).rl
        grpo = rl.advantage == "grpo"
        assert (rl.kl_loss_coef > 0, rl.kl_in_reward) == (grpo, not grpo), name


# A trajectory that exercises every component: a wrong then a right intermediate answer (d = 2 < n = 3).
RECORD = au.AutoSearchRecord(
    [au.SearchTurn(f"<think>t</think><search>{q}</search>", q, True)
     for q in ("eiffel tower location", "paris population", "louvre museum")],
    au.AnswerTurn("<think>t</think><answer>Paris</answer>", True), ["Lyon", "Paris", "Paris"], ["Paris"])


@pytest.mark.parametrize("preset,component", [("paper_no_efficiency", "efficiency"),
                                              ("paper_no_quality", "quality"), ("paper_no_base", "base")])
def test_ablation_presets_turn_one_component_off(preset, component):
    paper, ablation = autosearch.get_config("paper"), autosearch.get_config(preset)
    changed = {k for k, v in ablation.env.autosearch.items() if paper.env.autosearch[k] != v}
    ablation.env.autosearch = paper.env.autosearch
    assert ablation.workdir == f"runs/autosearch_{preset}" != paper.workdir  # each preset its own workdir
    ablation.workdir = paper.workdir
    assert ablation == paper and changed  # only reward coefficients differ
    full = au.autosearch_rewards(RECORD, au.RewardConfig(**paper.env.autosearch))
    off = au.autosearch_rewards(RECORD, au.RewardConfig(**autosearch.get_config(preset).env.autosearch))
    assert any(getattr(full, component)) and not any(getattr(off, component))
    for other in {"base", "quality", "efficiency"} - {component}:
        assert getattr(off, other) == getattr(full, other)


@pytest.mark.parametrize("module,preset,setup", [(search_r1, "paper", "a100x8"), (autosearch, "paper", "h100x8"),
                                                 (deepretrieval, "sql,no_reasoning", "a100x2"),
                                                 (deepretrieval, "sql_coder7b,no_reasoning", "a100x4"),
                                                 (rpl, "paper_qwen3_4b,pm", "v5p8")])
def test_a_hardware_setup_lays_out_the_run_and_changes_nothing_else(module, preset, setup):
    """The setup sets the mesh, the attention, remat, the reference's offload and the dtype of Adam's first
    moments; the paper's batch, micro-batch, lengths, workdir and JAX's memory share stay."""
    plain, laid_out = module.get_config(preset), module.get_config(f"{preset},{setup}")
    expected = hardware.SETUPS[setup]
    assert (laid_out.mesh.data, laid_out.mesh.fsdp, laid_out.mesh.tensor) == (1, expected.devices, 1)
    assert laid_out.mesh.attention.impl == expected.attention and laid_out.rl.remat
    assert laid_out.mesh.attention.paged == expected.paged
    assert laid_out.rl.offload_reference == expected.offload_reference
    for model in ("actor", "critic"):
        assert laid_out.rl[model].to_dict() == plain.rl[model].to_dict() | (
            {"mu_dtype": expected.mu_dtype} if expected.mu_dtype else {}), model
    for group in ("rollout", "train", "env", "data", "model", "distributed"):
        assert laid_out[group].to_dict() == plain[group].to_dict(), group
    assert laid_out.rl.micro_batch_size == plain.rl.micro_batch_size and laid_out.workdir == plain.workdir
    with pytest.raises(ValueError, match=r"optionally followed by .*'a100x2'"):
        module.get_config(f"{preset},a100x3")
