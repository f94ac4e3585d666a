"""Retrieval Program Learning: the policy writes programs over the retrieval SDK, run in the sandbox.

Usage: python -m searchrl.main --config configs/rpl.py:PRESET[,SPACE][,no_thinking][,SETUP] train
           [--config.x.y=...]
Presets:
  tiny            the CPU miniature of both claims (python -m searchrl.demo --config configs/rpl.py:tiny).
  smoke           tiny at its smallest: one seed end to end (`make smoke`).
  paper_qwen3_4b  Qwen3-4B, open-domain QA (NQ + HotpotQA) and GlobalQA, BM25 + e5 dense, the full SDK.
  paper_qwen3_8b  the same with Qwen3-8B.
SPACE, the action space (the paper's Table 4 rows): dense | dual | sdk (default) | pm (sdk plus program
mutation at step 200, config.env.mutation).
no_thinking: Qwen3's chat template with enable_thinking=False.
The RPL paper gives no training hyper-parameters: the paper presets use the Search-R1 PPO defaults the other
paper presets use ([R1] Search-R1's train_ppo.sh, as in configs/search_r1.py:paper), each cited below.
"""
from searchrl import run_config, task
from searchrl.configlib import miniature_workdir, sibling, to_config
from searchrl.tasks.rpl.config import RPLDemoConfig
from searchrl.tasks.rpl.env import ACTION_SPACES

search_r1 = sibling(__file__, "search_r1")
hardware = sibling(__file__, "hardware")

VARIANTS = (*ACTION_SPACES, "pm", "no_thinking")  # ",<variant>" suffixes of a preset


def _paper(config, preset: str, path: str):
    config = search_r1.paper(config)  # Search-R1's PPO, optimizer, KL and batch settings [R1]
    config.env = task.default_config("rpl")  # search_r1.paper set its own env group
    config.model.update(dict(preset=preset, path=path))
    config.data.update(dict(train="nq,hotpotqa,globalqa", eval="nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,"
                                                               "musique,bamboogle,globalqa"))
    config.retrieval.index_dir = "/data/indexes/wiki18_bm25"  # sparse_retrieval
    config.env.dense_index_dir = "/data/indexes/wiki18_e5_flat"  # dense_retrieval
    # rerank: a cross-encoder, as the paper's SDK describes rerank. The paper does not name the model;
    # searchrl's choice is cross-encoder/ms-marco-MiniLM-L-6-v2, a BERT cross-encoder searchrl.models.bert
    # loads (fetched beforehand, like every model).
    config.env.reranker_dir = "/data/models/ms-marco-MiniLM-L-6-v2"
    config.env.max_turns = 4  # program turns, as Search-R1's four search turns [R1]
    config.env.chat_template = True  # Qwen3 is prompted through its chat template;
    config.env.enable_thinking = True  # its thinking switch (",no_thinking" turns it off)
    config.env.mutation.sft.max_len = config.rollout.max_prompt_tokens + config.rollout.max_turn_tokens
    # Program mutation as the paper: its verified variants alone are distilled (searchrl's default also keeps
    # the programs no edit improves). at_step=200 comes with the ",pm" variant [the RPL paper].
    config.env.mutation.keep_unimproved = False
    # searchrl's own memory setting: every episode of the step decodes at once, its KV in a page pool sized
    # from the 60 GiB budget of an 80 GiB GPU: Qwen3's 8 key heads make a page 2.25 MiB (36 layers x 8 x 128 x
    # 2 (keys, values) x 2 bytes x 16 slots), so every row at its largest would take 72 GiB a GPU. Beside
    # Qwen3-4B's train state (12.2 GiB a GPU) and sampling weights (7.5), 12,288 pages take 27 GiB and hold
    # 3,072 slots a row on average; a row finding none free waits for an episode to end.
    config.rollout.pool_pages = 12288
    return config


def paper_qwen3_4b(config):
    return _paper(config, "qwen3_4b", "/data/models/Qwen3-4B")


def paper_qwen3_8b(config):
    config = _paper(config, "qwen3_8b", "/data/models/Qwen3-8B")
    # searchrl's own memory setting (see _paper): beside Qwen3-8B's train state (23.9 GiB a GPU) and sampling
    # weights (15.3), 7,168 pages take 15.75 GiB and hold 1,792 slots a row on average.
    config.rollout.pool_pages = 7168
    return config


def tiny(config):
    """The CPU miniature (`python -m searchrl.demo --config configs/rpl.py:tiny`, `searchrl.tasks.rpl.demo`): two
    RL seeds took 11 minutes on 2 shared cores; measured results in docs/rpl.md."""
    miniature_workdir(config, "runs/rpl_demo")
    config.demo = to_config(RPLDemoConfig())
    config.data.update(dict(train="globalqa", eval="globalqa", eval_split="test"))
    config.retrieval.kind = "local"
    config.model.preset = "tiny"
    config.model.update(dict(hidden_size=128, intermediate_size=384, num_layers=3, num_heads=4,
                             num_kv_heads=2, head_dim=32, tie_word_embeddings=True))
    # No dense index on the CPU: programs get BM25 with fuse and dedup; the search baseline gets BM25's top 3.
    # Answers cite shown documents by number (Search-R1's "Doc <n>" lines): a model trained from scratch on
    # a CPU budget learns that, where copying multi-token ids stays at zero answer F1 (docs/rpl.md).
    config.env.update(dict(action_space="sparse", max_turns=1, prompt_template="Question: {question}\n",
                           cite="rank"))
    # A program shows at most 4 documents, fewer than the search agent's two searches of 3.
    config.env.limits.update(dict(max_shown=4, max_retrieval_calls=4, max_docs_retrieved=200))
    # Scripted programs show 4 of BM25's top 8, at three depths. BM25 often ranks the passages of the
    # group's own entity first (a city's 2 before the persons born there, an organisation's 4 before its
    # employees), so the members stand at different numbers in them: an answer has to read the passages.
    config.demo.cold_start_windows = ((0, 4), (2, 6), (4, 8))
    # Every held-out task (seeds 0-4's worlds hold 326-347): at 128, the answer F1 difference of two
    # checkpoints was up to 0.03 away from its value on 331.
    config.demo.eval_questions = 512
    config.demo.parallel_seeds = 2  # on 2 cores a tiny model's step keeps about one busy
    # Observations: a search's 3 passages take up to ~110 tokens, a program's 4 up to ~150.
    config.rollout.update(dict(max_prompt_tokens=48, max_turn_tokens=24, max_obs_tokens=192,
                               obs_buckets=(112, 192), max_len=48 + 3 * 24 + 2 * 112, chunk_steps=12))
    config.rollout.sampling.temperature = 1.0
    # The cold start: prompts and first turns of every training task of every GlobalQA type (the copy of the
    # group's name into the query, cheap: rows of 128 tokens, as seed 4's world has some of more than 96),
    # then whole trajectories of the trained types.
    config.demo.prefix_sft.update(dict(steps=300, batch_size=64, max_len=128))
    config.demo.prefix_sft.optim.update(dict(lr=3e-3, warmup_steps=20, decay="cosine", decay_steps=300,
                                             min_lr_ratio=0.1))
    config.sft.update(dict(steps=150, batch_size=32, max_len=288))  # the longest scripted trajectory: ~270
    config.sft.optim.update(dict(lr=3e-3, warmup_steps=20, decay="cosine", decay_steps=150, min_lr_ratio=0.1))
    config.train.update(dict(steps=20, batch_size=32, checkpoint_every=10, eval_every=5))
    config.rl.update(dict(advantage="gae", gamma=1.0, lam=1.0, minibatch_size=32, micro_batch_size=32,
                          kl_in_reward=False, use_reference=False, entropy_coef=0.0))
    config.rl.actor.update(dict(lr=1e-4, warmup_steps=0))
    config.rl.critic.update(dict(lr=1e-3, warmup_steps=0))
    # Program mutation at the run's half (the demo sets at_step), on 512 training tasks' programs, up to 4
    # rounds of verified edits each: moving the shown window past the group's own passages (which BM25 ranks
    # first) takes 2 rounds for a city's group and 4 for an organisation's.
    # Distillation is SFT at twice RL's learning rate for 14 passes over the kept trajectories (190-310:
    # verified variants and the programs no edit improves), until the policy writes them. After about four
    # passes it still wrote one window for every question type, on training tasks too (seed 1: the kept
    # programs show [4:8] for an organisation's employees and [2:6] for a city's people; after 64 steps the
    # policy wrote [2:6] for both, employer dF1 on training tasks 0.785 -> 0.417; after 256, each type's own,
    # held-out dF1 0.322 -> 0.458). At 512 steps it over-fits (held-out answer F1 0.434 -> 0.366); at a
    # learning rate of 1e-3 it un-learns the answers (0.020).
    # Each kept program's answer is the best-scoring of the greedy one and 7 sampled, and is distilled too:
    # with the programs alone the answers kept citing the numbers the old window showed the members at.
    # Mutation minus continued RL, held-out answer F1 at step 20 on seeds 2 and 3: programs alone, 256 steps,
    # -0.004 and -0.012 (over 5 seeds +0.031 [-0.022, 0.083]); with the greedy answers +0.067 and -0.058;
    # best of 8, +0.048 and -0.025; best of 8 for 14 passes, +0.067 and +0.004 (seed 3 keeps 193
    # trajectories, seed 2 312: 256 steps are 21 passes over seed 3's, which then copied held-out names
    # worse).
    config.env.mutation.update(dict(episodes=512, max_variants=16, max_shown=4, rounds=4, answer_samples=8))
    config.env.mutation.sft.update(dict(epochs=14.0, batch_size=16, max_len=288))
    config.env.mutation.sft.optim.update(dict(lr=2e-4, warmup_steps=5))
    return config


def smoke(config):
    """`tiny` at its smallest (`make smoke`, `python -m searchrl.demo --size smoke`): one seed's cold start and
    its three RL arms (mutation after the first step) end to end, compiling most of the
    time. It checks that the miniature runs, not what it learns."""
    config = tiny(config)
    config.workdir = "runs/smoke/rpl"
    config.demo.update(dict(entities=300, eval_questions=8, seeds=(0,), parallel_seeds=1))
    for stage in (config.demo.prefix_sft, config.sft):  # one step each: one compile each
        stage.update(dict(steps=1, batch_size=8))
        stage.optim.update(dict(warmup_steps=0, decay="constant"))
    config.rollout.obs_buckets = (192,)  # one observation width: fewer rollout programs to compile
    config.train.update(dict(steps=2, batch_size=8, checkpoint_every=1, eval_every=1))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=8))
    config.env.mutation.update(dict(episodes=8, max_variants=4, rounds=1, answer_samples=1))
    config.env.mutation.sft.update(dict(epochs=1.0, batch_size=8))
    return config


PRESETS = {"tiny": tiny, "smoke": smoke, "paper_qwen3_4b": paper_qwen3_4b, "paper_qwen3_8b": paper_qwen3_8b}

# The hardware setups (configs/hardware.py) the docs recommend for the paper presets, by the preset's model:
# 8 H100s (compiled ahead of time by `python -m searchrl.benchmarks.aot_setups`).
PAPER_SETUPS = {"qwen3_4b": ("h100x8",), "qwen3_8b": ("h100x8",)}


def get_config(arg: str = "tiny"):
    name, setup = hardware.split(arg)
    preset, *options = name.split(",")
    spaces = [o for o in options if o in (*ACTION_SPACES, "pm")]
    if preset not in PRESETS or len(spaces) > 1 or set(options) - set(VARIANTS):
        raise ValueError(f"Unknown preset {arg!r} for configs/rpl.py; expected one of {sorted(PRESETS)}, "
                         f"optionally followed by ',<action space>' (one of {sorted(ACTION_SPACES)} or pm) "
                         f"and ',no_thinking', then ',<setup>' ({sorted(hardware.SETUPS)})")
    config = run_config.experiment_config("rpl")
    config = PRESETS[preset](config)
    if spaces:
        config.env.action_space = "sdk" if spaces[0] == "pm" else spaces[0]
    if "pm" in spaces:
        config.env.mutation.at_step = 200  # mutation at step 200, then RL resumes [the RPL paper]
    if "no_thinking" in options:
        config.env.enable_thinking = False
    return run_config.preset_workdir(hardware.apply(config, setup), __file__, name)
