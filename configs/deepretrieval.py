"""DeepRetrieval: RL query rewriting rewarded by a real retriever's metric, for four task families.

Usage: python -m searchrl.main --config configs/deepretrieval.py:PRESET[,no_reasoning][,SETUP] train
           [--config.x.y=...]
       python -m searchrl.demo  --config configs/deepretrieval.py:tiny
Presets (",no_reasoning" appended to any: the paper's ablation without <think>):
  literature        PubMed search (LEADS-style reviews, Recall@3K).
  literature_ctgov  the same on ClinicalTrials.gov.
  evidence          NQ evidence seeking with BM25 over Wikipedia (answer-rank tiers; H@1/5/20).
  classic           BEIR (MS MARCO by default) with BM25 (NDCG@3000 reward; NDCG@10, Recall@100).
  classic_dense     the same with the dense retriever (FAISS).
  sql               Spider text-to-SQL (execution match), optional SFT cold start (`config.sft`).
  sql_coder7b       Spider on Qwen2.5-Coder-7B-Instruct (the paper's 7B SQL model, trained on 4 A100s).
  sql_bird          BIRD (its 0.3 bonus for SQL that executes but returns other rows).
  tiny_<family>     each family at CPU size for tests (point data, index and tokenizer at local files).
  tiny              the CPU miniature: a synthetic world where users and documents use different words.
Paths under /data are placeholders for local directories you provide. Sources cited below: [P] the
DeepRetrieval paper's Appendix B.2, [DR] pat-jj/DeepRetrieval code/scripts/train/*.sh and its reward code.
"""
import os

from searchrl import run_config
from searchrl.configlib import sibling, to_config
from searchrl.tasks.deepretrieval.config import RewriteDemoConfig

hardware = sibling(__file__, "hardware")

RESPONSE_TOKENS = {"literature": 500, "evidence": 350, "classic": 512, "sql": 512}  # [P] B.2
PROMPT_TOKENS = {"literature": 500, "evidence": 256, "classic": 256, "sql": 2048}  # max_prompt_length [DR]


def _paper(config, task):
    """What every family shares at paper scale [P B.2, DR]: Qwen2.5-3B-Instruct actor and critic, PPO with
    GAE, the KL penalty in the reward, temperature 0.6, batch 64, minibatch 16."""
    config.model.preset = "qwen2p5_3b"
    config.model.path = "/data/models/Qwen2.5-3B-Instruct"  # actor and critic init [P, DR model.path]
    config.model.param_dtype = "bfloat16"
    config.env.task = task
    config.env.chat_template = True  # an instruct model: its own chat template renders the prompt
    config.rollout.update(dict(
        max_prompt_tokens=PROMPT_TOKENS[task], max_turn_tokens=RESPONSE_TOKENS[task],
        max_len=PROMPT_TOKENS[task] + RESPONSE_TOKENS[task], obs_buckets=(8,), max_obs_tokens=8))
    config.rollout.sampling.temperature = 0.6  # rollout.temperature=0.6 [P, DR]
    config.train.update(dict(
        batch_size=64,  # data.train_batch_size=64 [P, DR]
        # [DR] trains 5 epochs (10 for PubMed and MS MARCO): steps = epochs x questions / 64 for your data.
        steps=1000, checkpoint_every=100, eval_every=50))
    rl = config.rl
    rl.advantage, rl.gamma, rl.lam = "gae", 1.0, 1.0  # verl's PPO defaults [DR]
    rl.minibatch_size, rl.micro_batch_size = 16, 8  # ppo_mini_batch_size=16, ppo_micro_batch_size=8 [DR]
    rl.actor.lr = 1e-6  # actor.optim.lr=1e-6 [P, DR]
    rl.critic.lr = 1e-5  # critic.optim.lr=1e-5 [P, DR]
    rl.use_reference = True
    rl.kl_in_reward = True  # algorithm.kl_ctrl.kl_coef=0.001: verl's KL penalty in the reward [P, DR]
    rl.kl_coef = 0.001
    rl.kl_reward_estimator = "k1"  # verl's default kl_penalty="kl"
    rl.compute_dtype = "bfloat16"
    rl.remat = True  # enable_gradient_checkpointing=True [DR]
    config.mesh.update(dict(data=1, fsdp=-1, tensor=1))
    return config


def literature(config):
    config = _paper(config, "literature")
    config.data.update(dict(format="literature", dir="/data/deepretrieval", train="pubmed", eval="pubmed"))
    config.retrieval.update(dict(kind="pubmed", cache_path="/data/cache/pubmed.jsonl"))  # asks once per query
    config.env.depth = 3000  # search_with_keywords(topk=3000), Recall@3K [P, DR pubmed.py]
    return config


def literature_ctgov(config):
    config = literature(config)
    config.data.update(dict(train="ctgov", eval="ctgov"))
    config.retrieval.update(dict(kind="ctgov", cache_path="/data/cache/ctgov.jsonl"))
    return config


def evidence(config):
    config = _paper(config, "evidence")
    config.data.update(dict(format="qa", dir="/data/flashrag", train="nq", eval="nq,triviaqa,squad"))
    # pyserini's Lucene index [DR nq_serini.py]
    config.retrieval.index_dir = "/data/indexes/wikipedia-dpr-100w"
    config.env.depth = 3000  # answer-rank tiers up to rank 3000 [DR squad.py]
    return config


def classic(config):
    config = _paper(config, "classic")
    config.data.update(dict(format="beir", dir="/data/beir", train="msmarco", eval="msmarco",
                            eval_split="dev"))
    config.retrieval.index_dir = "/data/indexes/beir_msmarco_bm25"
    config.env.depth = 3000  # retriver_items(top_k=3000), NDCG@3000 [DR msmarco_beir.py]
    return config


def classic_dense(config):
    config = classic(config)
    config.retrieval.index_dir = "/data/indexes/beir_msmarco_dense"  # a searchrl dense (FAISS) index
    return config


def sql(config):
    config = _paper(config, "sql")
    config.data.update(dict(format="spider", dir="/data/sql", train="spider", eval="spider",
                            eval_split="dev"))
    # The optional cold start [P]: 6 epochs at batch 8, lr 2e-5 (`python -m searchrl.main ... sft`).
    config.sft.update(dict(batch_size=8, max_len=PROMPT_TOKENS["sql"] + RESPONSE_TOKENS["sql"]))
    config.sft.optim.lr = 2e-5
    return config


def sql_coder7b(config):
    """`sql` on Qwen2.5-Coder-7B-Instruct, the paper's SQL model at 7B, trained on 4 A100-80GB [P, Appendix
    "Hardware"] (Qwen2.5-7B's architecture: preset qwen2p5_7b)."""
    config = sql(config)
    config.model.update(dict(preset="qwen2p5_7b", path="/data/models/Qwen2.5-Coder-7B-Instruct"))
    return config


def sql_bird(config):
    config = sql(config)
    config.data.update(dict(format="bird", train="bird", eval="bird"))
    config.env.reward.sql_executes_score = 0.3  # runs but returns other rows [DR bird.py]
    return config


def _tiny(config):
    """CPU size: a random tiny model, short prompts and responses, a few small steps."""
    config.model.update(dict(preset="tiny", path="", param_dtype="float32"))
    config.env.chat_template = False
    config.rl.update(dict(compute_dtype="float32", remat=False, minibatch_size=8, micro_batch_size=8))
    config.rl.actor.lr = config.rl.critic.lr = 1e-4
    config.rollout.update(dict(max_prompt_tokens=512, max_turn_tokens=24, max_len=512 + 24, chunk_steps=8))
    config.train.update(dict(steps=2, batch_size=8, checkpoint_every=0, eval_every=0,
                             async_checkpoints=False))
    config.mesh.update(dict(data=-1, fsdp=1, tensor=1))
    return config


def tiny(config):
    """The miniature (`searchrl.tasks.deepretrieval.demo`): every size here fits two seeds in ~20 minutes on 2 cores."""
    config = _tiny(classic(config))
    config.workdir = "runs/deepretrieval_demo"
    config.demo = to_config(RewriteDemoConfig())
    config.data.update(dict(dir=config.workdir, train="rewrite_world", eval="rewrite_world",
                            eval_split="test"))
    config.retrieval.update(dict(kind="local", index_dir=os.path.join(config.workdir, "index")))
    config.tokenizer = os.path.join(config.workdir, "tokenizer")
    config.model.update(dict(hidden_size=128, intermediate_size=384, num_layers=3, num_heads=4,
                             num_kv_heads=2, head_dim=32, tie_word_embeddings=True))
    # The user's words are the whole prompt; the answer opens as in the paper's no-reasoning BEIR prompt.
    config.env.update(dict(reasoning=False, user_template="{question}", system="",
                           assistant_prefix="\n<answer>\n", depth=200))
    config.env.reward.ndcg_k = 200  # the world has ~2k documents: NDCG over everything retrieved
    config.rollout.update(dict(max_prompt_tokens=24, max_turn_tokens=16, max_len=40, chunk_steps=16))
    config.rollout.sampling.temperature = 1.0
    config.sft.update(dict(steps=600, batch_size=64, max_len=40))
    config.sft.optim.update(dict(lr=3e-3, warmup_steps=20, decay="cosine", decay_steps=600, min_lr_ratio=0.1))
    config.train.update(dict(steps=200, batch_size=32))
    config.rl.update(dict(minibatch_size=32, micro_batch_size=32, kl_in_reward=False, use_reference=False))
    config.rl.actor.lr = 3e-4
    config.rl.critic.lr = 1e-3
    return config


FAMILIES = {"literature": literature, "literature_ctgov": literature_ctgov, "evidence": evidence,
            "classic": classic, "classic_dense": classic_dense, "sql": sql, "sql_coder7b": sql_coder7b,
            "sql_bird": sql_bird}
PRESETS = {**FAMILIES, **{f"tiny_{name}": (lambda c, f=f: _tiny(f(c))) for name, f in FAMILIES.items()},
           "tiny": tiny}


def get_config(arg: str = "tiny"):
    name, setup = hardware.split(arg)
    preset, _, variant = name.partition(",")
    if preset not in PRESETS or variant not in ("", "no_reasoning"):
        raise ValueError(f"Unknown preset {arg!r} for configs/deepretrieval.py; expected one of "
                         f"{sorted(PRESETS)}, optionally followed by ',no_reasoning' and ',<setup>' "
                         f"({sorted(hardware.SETUPS)})")
    config = PRESETS[preset](run_config.experiment_config("deepretrieval"))
    if variant:
        config.env.reasoning = False
    return run_config.preset_workdir(hardware.apply(config, setup), __file__, name)
