"""AutoSearch: Search-R1's PPO plus turn-level rewards for format, answer-quality gains of the intermediate answers
and stopping at the minimal sufficient search depth.

Usage: python -m searchrl.main --config configs/autosearch.py:PRESET[,SETUP] train [--config.x.y=value ...]
       python -m searchrl.demo  [--config configs/autosearch.py:tiny]
Presets:
  tiny                 the CPU demo: a synthetic world, BM25, a tiny model, SFT cold start then PPO.
  tiny_no_efficiency   the demo's ablation: the efficiency reward off (AutoSearch's ablation in miniature).
  smoke                tiny at its smallest, every stage end to end (`make smoke`).
  tiny_arms            the demo over 5 seeds with three RL arms from each seed's cold start: AutoSearch, the
                       no-efficiency ablation and a fixed cost per search (results.json's claims).
  paper                AutoSearch's public PPO run on Qwen2.5-3B base, with the reward as the paper means it
                       (searchrl/tasks/autosearch/rewards.py lists where the public code differs).
  paper_public_reward  the same with the public code's reward exactly (env.autosearch.public_code).
  paper_no_efficiency, paper_no_quality, paper_no_base
                       the paper-scale ablations: one reward component off.
  paper_grpo           the same with GRPO (5 responses per prompt, KL as a loss), no critic.
Sources cited below, all in github.com/bofusun/AutoSearch: [AS] experiments/train_autosearch.sh, [AY] the
defaults it leaves unset, verl/trainer/config/ppo_trainer_tune.yaml, [AT] the trainer it runs
(verl/trainer/ppo/ray_trainer_turn64.py, search_r1/llm_agent/generation_turn1.py), [AR] its reward manager
(verl/trainer/main_ppo_format_turn_new78.py); [AS] repeats Search-R1's
v0.2 PPO settings, which configs/search_r1.py:paper cites (tests/app/test_presets.py checks every value
against [AS]). [G2] Search-R1's scripts/nq_hotpotqa/v0.2/train_grpo.sh.
"""
from searchrl import run_config
from searchrl.configlib import miniature_workdir, sibling, to_config
from searchrl.tasks.autosearch import rewards
from searchrl.tasks.autosearch.config import DemoConfig

search_r1 = sibling(__file__, "search_r1")
hardware = sibling(__file__, "hardware")

DEMO_PROMPT = "Question: {question}\n"
# The demo's intermediate answers open the way its scripted answer turns do
# (searchrl.tasks.autosearch.scripted.answer_turn; the demo checks that they agree).
DEMO_ANSWER_PROMPT = "<think> I can answer. </think><answer>"


def paper(config):
    config = search_r1.paper(config)
    config.env.reward = "autosearch"  # turn-level rewards; config.env's defaults: an intermediate answer
    #                                   after every search step [AS]
    config.model.path = "/data/models/Qwen2.5-3B"  # BASE_MODEL=.../Qwen2.5-3B [AS]
    config.env.max_turns = 4  # max_turns=4 [AS]
    config.rollout.update(dict(
        max_prompt_tokens=2048,  # data.max_start_length=2048 [AS]
        max_turn_tokens=500,  # data.max_response_length=500 [AS]
        max_obs_tokens=800,  # data.max_obs_length=800 [AS]
        obs_buckets=(200, 400, 800),
        # The longest sequence [AS] trains on: that prompt, then the turns and observations cut to their
        # first data.max_prompt_length=6500 tokens (generation_turn1.py _update_right_side [AT]).
        max_len=2048 + 6500,
    ))
    # KL in the reward with the low-variance estimator: algorithm.kl_penalty="low_var_kl" [AS], each token's
    # estimate clamped to [-5, 5] (ray_trainer_turn64.py apply_kl_penalty [AT]); coefficient 0.001 [AS].
    config.rl.kl_reward_estimator = "low_var_kl"
    config.rl.kl_reward_clip = 5.0
    # Each intermediate answer from its own chat prompt, the question and the trajectory so far
    # ([AR]:421-438, searchrl.tasks.search_r1.env.PUBLIC_ANSWER_USER), not by continuing the trajectory.
    config.env.intermediate_answer_mode = "public_prompt"
    # vLLM's max_tokens=rollout.response_length ([AY]:73) = data.max_response_length=500 ([AS]:28).
    config.env.intermediate_answer_tokens = 500
    # generate_extra_outputs_for_qa_em(temperature=1.0) ([AR]:510) with its defaults top_p=0.9, top_k=50
    # ([AR]:193-194). Note: [AR] puts these in `sampling_kwargs` (:216) but never passes them on to
    # generate_sequences (:234), so vLLM sampled with the rollout's settings: temperature=1 ([AS]:50),
    # top_p=1.0 ([AS]:51), top_k=-1 ([AY]:70).
    config.env.intermediate_answer_sampling.update(dict(temperature=1.0, top_p=0.9, top_k=50))
    # searchrl's own memory setting: a page pool sized from the 60 GiB budget, not from every row at its
    # largest with an intermediate answer's pages beside it (64 rows a GPU x 1,327 pages: 46.7 GiB, over the
    # budget beside the train state, 9.4 GiB, and the sampling weights, 5.7). 65,536 pages of 16 slots, at
    # 0.5625 MiB a page (Qwen2.5-3B: 36 layers x 2 key heads x 128 x 2 (keys, values) x 2 bytes x 16), take
    # 36 GiB; a row finding none free waits for an episode to end. paper_grpo's 320 rows a GPU share them.
    config.rollout.pool_pages = 65536
    return config


def paper_public_reward(config):
    """The public code's reward exactly (searchrl/tasks/autosearch/rewards.py, public_rewards)."""
    config = paper(config)
    config.env.autosearch.public_code = True
    return config


def _no_efficiency(config):
    config.env.autosearch.update(rewards.EFFICIENCY_OFF)
    return config


def paper_no_efficiency(config):
    """Ablation: no reward for stopping at the minimal sufficient depth."""
    return _no_efficiency(paper(config))


def paper_no_quality(config):
    """Ablation: no reward for the intermediate answers' F1 gains."""
    config = paper(config)
    config.env.autosearch.quality_coef = 0.0
    return config


def paper_no_base(config):
    """Ablation: no format, redundancy or correct-answer reward (efficiency still reads correctness)."""
    config = paper(config)
    config.env.autosearch.update(dict(search_format_reward=0.0, answer_format_reward=0.0,
                                      answer_format_penalty=0.0, correct_answer_reward=0.0))
    return config


def paper_grpo(config):
    """GRPO as Search-R1's [G2] (AutoSearch publishes no GRPO script): configs/search_r1.py's `grpo`."""
    return search_r1.grpo(paper(config))


def tiny(config):
    """The demo: every size here is chosen so that install + world + SFT + PPO + evaluation fit ~20 minutes on
    2 CPU cores."""
    miniature_workdir(config, "runs/demo")
    config.demo = to_config(DemoConfig())
    # The scripted SFT data over-searches on 60% of questions: the greedy cold start still searches once more
    # than needed on 1-hop questions (1.97-2.01 searches), but 40% of its trajectories stop there, not 30%, so
    # PPO samples stopping more often. At 0.7, in 40 steps seeds 1 and 3 barely learnt to stop (1-hop searches
    # 1.98 -> 2.02, 1.99 -> 1.84); at 0.6 both stop at the minimal depth (2.00 -> 1.00, 2.01 -> 1.02).
    config.demo.extra_search_fraction = 0.6
    # ... and practises the answer before that extra search on 30% of those (scripted.early_answers): at 0 a
    # policy stopping early answered worse (EM -2 to -5 points); at 1 the direct answer was the better one and
    # PPO stopped early even without the efficiency reward (the ablation lost its effect).
    config.demo.early_answer_fraction = 0.3
    # Four questions per entity (12,800 training questions), not two: at two the tiny model memorised its
    # training subjects instead of learning to copy them. Same SFT steps: on seed 0 the first query copied the
    # subject right 55% -> 90% of the time and cold-start 1-hop EM rose 0.295 -> 0.589; but seed 1 reached
    # only 0.326 at four (byte-level BPE names: 600 prefix steps gave seeds 1 and 2 0.476 and 0.489; 8,000
    # entities on top, 0.581 and 0.316).
    config.demo.questions_per_entity = 4.0
    # Names are cut into syllables (synthetic.NAME_SYLLABLES); 2,000 tokens hold the syllable inventory whole,
    # so that a name's first token says which name it is. Byte-level BPE at 1,200 often cut a name after its
    # first letter. At 300 prefix steps, seed 2's cold-start 1-hop EM rose 0.310 -> 0.478; seed 1's stayed
    # (0.326 -> 0.332): its answers still came from memory, not the passage (see the prefix steps below).
    config.demo.vocab_size = 2000
    model = config.model
    model.preset = "tiny"
    model.update(dict(hidden_size=128, intermediate_size=384, num_layers=3, num_heads=4, num_kv_heads=2,
                      head_dim=32, tie_word_embeddings=True))
    config.data.train, config.data.eval = "world", "world"
    config.data.eval_split = "test"
    # The world's plan queries find their passage at BM25 rank 1, so one passage per search is enough.
    config.env.update(dict(prompt_template=DEMO_PROMPT, topk=1, max_turns=4, answer_prompt=DEMO_ANSWER_PROMPT,
                           intermediate_answer_tokens=12))
    config.rollout.update(dict(max_prompt_tokens=40, max_turn_tokens=32, max_obs_tokens=64, obs_buckets=(32, 64),
                               max_len=40 + 5 * 32 + 4 * 64, chunk_steps=32))
    config.rollout.sampling.temperature = 1.0
    # The cold start trains first on two-turn prefixes (scripted.turn_prefixes): a third of a trajectory's
    # tokens, yet both copies a search agent makes (question -> query, passage -> answer or next query). Without
    # that stage the tiny model memorises the training subjects instead of learning to copy unseen ones.
    # 600 steps, not 300: with syllable names the prefix loss then fell to 0.11 and 0.09 (0.37-0.38 at 300),
    # and cold-start 1-hop EM rose on seed 1 from 0.332 to 0.455 (seed 3: 0.510).
    config.demo.prefix_sft.update(dict(steps=600, batch_size=64, max_len=160))
    config.demo.prefix_sft.optim.update(dict(lr=3e-3, warmup_steps=20, decay="cosine", decay_steps=600,
                                             min_lr_ratio=0.1))
    config.sft.update(dict(steps=250, batch_size=32, max_len=config.rollout.max_len))
    config.sft.optim.update(dict(lr=3e-3, warmup_steps=20, decay="cosine", decay_steps=250, min_lr_ratio=0.1))
    config.train.update(dict(steps=40, batch_size=32, checkpoint_every=20, eval_every=0))
    # A 40-step run sees each decision a few hundred times, not a thousand steps' worth: the overshoot penalty
    # is raised from 0.05, at which 1-hop searches fell only 15% and 25% (seeds 2 and 3). It lands on the
    # extra search and on the answer turn, so a right answer after one unneeded search nets 1 - 2 * penalty:
    # at 0.25 half a right answer, so stopping early paid even where it lost answers: over 5 seeds 1-hop
    # searches fell 47% but 2- and 3-hop EM by 1.8 and 4.0 points. At 0.1, with 70% over-search, 2- and 3-hop
    # EM held (-0.3, -0.9 points) but 1-hop searches fell only 28% (seeds 1 and 3, above). With 60%
    # (docs/results.md) every seed stops at the minimal depth (1-hop searches -48%), and 2- and 3-hop EM fall
    # 1.5 points each: the extra search, for a half-copied answer, finds the passage titled with the right
    # one, whose title the answer then copies. That repaired 5-13% of the cold starts' over-searching 2- and
    # 3-hop answers (seeds 0, 1), and the policy cannot tell which ones from the passages it has read.
    # Nor is it the penalty's size, the policy's drift or the hop mix. From seeds 0 and 1's cold starts, the
    # change of 2-hop / 3-hop EM on all 1,600 test questions (on 384, one 3-hop question is 1.3 points): at
    # 0.1, -2.3 / -2.9 and +0.2 / -1.9; at 0.075, -0.4 / -1.9 and -0.4 / -2.2; the KL loss at 0.01,
    # -1.4 / -2.9 and 0 / -1.2; RL on every multi-hop training question but only 2,560 1-hop ones,
    # +1.5 / -1.3 (1-hop searches fell only 37%) and -1.7 / -2.5. On 384 questions, at 0.05: -3.6 / -1.5
    # and -2.4 / -1.3; the actor at 5e-5: 0 / -3.0 (1-hop searches fell only 28%) and -2.4 / +2.7. Twice the
    # RL steps narrow the loss (`tiny_arms`).
    config.env.autosearch.efficiency_overshoot_penalty = 0.1
    # The step-penalty arm (`tiny_arms`) charges every search what AutoSearch charges an unneeded one.
    config.demo.step_penalty = config.env.autosearch.efficiency_overshoot_penalty
    rl = config.rl
    rl.update(dict(advantage="gae", gamma=1.0, lam=1.0, minibatch_size=32, micro_batch_size=32, ppo_epochs=1,
                   use_reference=True, kl_loss_coef=0.001, kl_loss_type="low_var_kl", entropy_coef=0.0))
    # Adam moves every weight by about lr per step, signal or not: at 2e-4 the tiny policy's copying of names
    # degraded (EM -2.5 to -5 points); 1e-4 keeps it within about 2 points across seeds.
    rl.actor.update(dict(lr=1e-4, warmup_steps=0))
    rl.critic.update(dict(lr=1e-3, warmup_steps=0))
    return config


def tiny_no_efficiency(config):
    config = _no_efficiency(tiny(config))
    config.workdir = "runs/demo_no_efficiency"  # the world's paths follow it (miniature_workdir)
    return config


def tiny_arms(config):
    """The demo's claims over 5 seeds: AutoSearch, the no-efficiency ablation and a fixed cost per search,
    each trained from the same cold start of a seed (searchrl/tasks/autosearch/demo.py ARMS)."""
    config = tiny(config)
    config.workdir = "runs/demo_arms"  # the world's paths follow it (miniature_workdir)
    config.demo.seeds = (0, 1, 2, 3, 4)
    config.demo.arms = ("autosearch", "no_efficiency", "step_penalty")
    # Two seeds at a time: on 2 cores a tiny model's step keeps about one busy; two cold starts side by side
    # took 14.4 min, one alone 9.5-11.
    config.demo.parallel_seeds = 2
    # Three times the demo's RL steps. At twice (80): from seeds 0 and 1's cold starts, with the extra search
    # dropped everywhere, 2-hop / 3-hop EM changed +0.9 / -1.0 and +0.6 / -1.9 points (at 40 steps, above);
    # the step-penalty arm, at the same 1-hop cut, -0.4 / -3.8 and -0.2 / -2.8; the no-efficiency ablation
    # cut 1-hop searches 20% on seed 0 and, like AutoSearch, 50% on seed 1. Over 5 seeds the 3-hop loss
    # narrowed from 1.5 points at 40 steps (02c6a80) to 1.1 at 80 (66aea6c); the actor's lr is constant, so
    # 120 steps continue the 80-step runs; at 120 the 3-hop answers at the same depth are right more often
    # (docs/results.md).
    config.train.steps = 120
    # The claims on the whole test split (1,600 questions; on 384, one 3-hop question is 1.3 points); the
    # budget curves on its first 384 (each budget is one more evaluation).
    config.demo.eval_questions = 1600
    return config


def smoke(config):
    """`tiny` at its smallest (`make smoke`, `python -m searchrl.demo --size smoke`): every stage end to end,
    compiling most of the time. It checks that the miniature runs, not what it learns."""
    config = tiny(config)
    config.workdir = "runs/smoke/autosearch"
    config.demo.update(dict(entities=200, questions_per_entity=1.0, eval_questions=16, budgets=(1,),
                            budget_questions=8))
    for stage in (config.demo.prefix_sft, config.sft):  # one step each: one compile each
        stage.update(dict(steps=1, batch_size=8))
        stage.optim.update(dict(warmup_steps=0, decay="constant"))
    config.rollout.obs_buckets = (64,)  # one observation width: fewer rollout programs to compile
    config.train.update(dict(steps=2, batch_size=8, checkpoint_every=2))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=8))
    return config


PRESETS = {"tiny": tiny, "tiny_no_efficiency": tiny_no_efficiency, "tiny_arms": tiny_arms, "smoke": smoke,
           "paper": paper,
           "paper_public_reward": paper_public_reward, "paper_no_efficiency": paper_no_efficiency,
           "paper_no_quality": paper_no_quality, "paper_no_base": paper_no_base, "paper_grpo": paper_grpo}

# The hardware setups (configs/hardware.py) the docs recommend for the paper presets, by the preset's model:
# 8 A100s or H100s, or 8 TPU v5p chips (compiled ahead of time by `python -m searchrl.benchmarks.aot_setups`).
PAPER_SETUPS = {"qwen2p5_3b": ("a100x8", "h100x8", "v5p8")}


def get_config(arg: str = "tiny"):
    preset, setup = hardware.split(arg)
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {arg!r} for configs/autosearch.py; expected one of "
                         f"{sorted(PRESETS)}, optionally followed by ',<setup>' ({sorted(hardware.SETUPS)})")
    config = hardware.apply(PRESETS[preset](run_config.experiment_config("autosearch")), setup)
    return run_config.preset_workdir(config, __file__, preset)
