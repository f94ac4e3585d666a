"""DeepRetrieval: RL query rewriting rewarded by a real retriever's metric, for four task families.

Usage: python -m searchrl.main --config configs/deepretrieval.py:PRESET[,no_reasoning][,SETUP] train
           [--config.x.y=...]
       python -m searchrl.demo  --config configs/deepretrieval.py:tiny
Presets (",no_reasoning" appended to any: the paper's ablation without <think>, with the public no_reason
prompt; set reasoning through this variant, not --config.env.reasoning, so that the prompt follows):
  literature        PubMed search (LEADS-style reviews, Recall@3K).
  literature_ctgov  the same on ClinicalTrials.gov.
  evidence_<d>      evidence seeking with BM25 over Wikipedia, d in nq, triviaqa, squad (answer-rank tiers;
                    H@1/5/20); `evidence` is evidence_nq. TriviaQA and SQuAD start from the NQ run's
                    step-1800 actor and critic (`checkpoint export` writes both).
  classic_<d>[_dense]  BEIR d in msmarco, nfcorpus, fever, hotpotqa, scifact, or the MS MARCO subsets
                    msmarco_health, msmarco_science, msmarco_tech, with BM25 or (_dense) the paper's encoder
                    (NDCG@3000 reward; NDCG@10, Recall@100); `classic` / `classic_dense`: MS MARCO's.
  sql               Spider text-to-SQL (execution match, evaluated on Spider's test set), optional SFT cold
                    start (`main ... sft`; start RL from config.model.path=<workdir>/sft/epoch_1).
  sql_coder7b       Spider on Qwen2.5-Coder-7B-Instruct (the paper's 7B SQL model, trained on 4 A100s).
  sql_bird          BIRD (its 0.3 bonus for SQL that executes but returns other rows).
  tiny_<family>     each family at CPU size for tests (point data, index and tokenizer at local files).
  tiny              the CPU miniature: a synthetic world where users and documents use different words.
  smoke             tiny at its smallest, every stage end to end (`make smoke`).
Paths under /data are placeholders for local directories you provide (`docs/deepretrieval.md` builds them).
Sources cited below: [P] the DeepRetrieval paper's Appendix B.2 and Eq. 3; [DR x] the file x of
pat-jj/DeepRetrieval under code/ (train scripts under scripts/train/, verl's defaults in
verl/trainer/config/ppo_trainer.yaml, the dense retrievers under verl/utils/reward_score_dense/).

Where the paper and a script disagree, the script wins (it ran the reported numbers) and the preset says so:
- evidence_nq and evidence_squad keep verl's rollout temperature 1.0 (their scripts set none), the others 0.6;
  evidence_nq answers in up to 512 tokens as nq.sh, where B.2 gives 350 for evidence seeking.
- Length: every paper preset runs its script's trainer.total_epochs (EPOCHS below, `train.epochs`), so a run
  makes epochs x (training questions // batch) updates, as verl's drop_last dataloader does.
- The SQL cold start runs the public SFT's epochs (4, or 2 without reasoning) with its learning rate decaying
  linearly over all of them, and saves epoch 1, the checkpoint the paper keeps, at <workdir>/sft/epoch_1:
  point config.model.path there for RL (<workdir>/sft holds the last epoch's weights).
"""
from searchrl import run_config
from searchrl.configlib import miniature_workdir, sibling, to_config
from searchrl.tasks.deepretrieval import prompts
from searchrl.tasks.deepretrieval.engines import ClinicalTrialsOptions, PubMedOptions
from searchrl.tasks.deepretrieval.config import RewriteDemoConfig

hardware = sibling(__file__, "hardware")

RESPONSE_TOKENS = {"literature": 500, "evidence": 350, "classic": 512, "sql": 512}  # [P] B.2
PROMPT_TOKENS = {"literature": 500, "evidence": 256, "classic": 256, "sql": 2048}  # max_prompt_length [DR]
# The query encoder of each dense index, pooling and query prefix (build the index with the same: the index's
# manifest carries them): BGE-base [DR reward_score_dense/{msmarco_beir,nfcorpus,fever,hotpotqa}.py:
# faiss-flat.*.bge-base-en-v1.5], multilingual E5-Large-instruct [DR reward_score_dense/scifact.py,
# src/Dense/scifact/1_convert_emb.py] and Contriever for the MS MARCO subsets
# [DR scripts/train/msmarco_dense.sh encoder=contriever, src/eval/Dense/msmarco_sub.py pooling='mean'].
BGE_BASE = ("BAAI/bge-base-en-v1.5", "cls")
E5_LARGE = ("intfloat/multilingual-e5-large-instruct", "mean")
CONTRIEVER = ("facebook/contriever", "mean")
SUBSETS = ("msmarco_health", "msmarco_science", "msmarco_tech")
DENSE_ENCODERS = {"msmarco": BGE_BASE, "nfcorpus": BGE_BASE, "fever": BGE_BASE, "hotpotqa": BGE_BASE,
                  "scifact": E5_LARGE, **{name: CONTRIEVER for name in SUBSETS}}
# Each run's length: verl's trainer.total_epochs, cited by script and line [DR scripts/train/<file>:<line>];
# `train.epochs` runs it as verl does, epochs x (training questions // batch) updates. The families' own names
# take their default dataset's (evidence: nq.sh, classic: msmarco_beir.sh, sql_coder7b: spider.sh).
EPOCHS = {"literature": (10, "pubmed.sh:38"), "literature_ctgov": (5, "ctgov.sh:42"),
          "evidence_nq": (5, "nq.sh:41"), "evidence_triviaqa": (5, "triviaqa.sh:43"),
          "evidence_squad": (5, "squad.sh:42"),
          "classic_msmarco": (10, "msmarco_beir.sh:42"), "classic_nfcorpus": (10, "nfcorpus.sh:42"),
          "classic_fever": (10, "fever.sh:42"), "classic_hotpotqa": (10, "hotpotqa.sh:42"),
          "classic_scifact": (100, "scifact.sh:42"),
          "classic_msmarco_dense": (10, "dense/msmarco_beir.sh:42"),
          "classic_nfcorpus_dense": (30, "dense/nfcorpus.sh:42"),
          "classic_fever_dense": (10, "dense/fever.sh:42"),
          "classic_hotpotqa_dense": (10, "dense/hotpotqa.sh:42"),
          "classic_scifact_dense": (50, "dense/scifact.sh:43"),
          **{f"classic_{name}": (5, "msmarco.sh:45") for name in SUBSETS},
          **{f"classic_{name}_dense": (5, "msmarco_dense.sh:50") for name in SUBSETS},
          "sql": (5, "spider.sh:64"), "sql_bird": (5, "bird.sh:60")}
# A family's name: the run whose length it takes.
EPOCHS_OF = {"evidence": "evidence_nq", "classic": "classic_msmarco",
             "classic_dense": "classic_msmarco_dense", "sql_coder7b": "sql"}


def _paper(config, task):
    """What every family shares at paper scale [P B.2, DR]: Qwen2.5-3B-Instruct actor and critic, PPO with
    GAE, the KL penalty in the reward, the entropy bonus of Eq. 3, temperature 0.6, batch 64, minibatch 16."""
    config.model.preset = "qwen2p5_3b"
    config.model.path = "/data/models/Qwen2.5-3B-Instruct"  # actor and critic init [P, DR model.path]
    config.model.param_dtype = "bfloat16"
    config.env.task = task
    config.env.chat_template = True  # an instruct model: its own chat template renders the prompt
    _lengths(config, PROMPT_TOKENS[task], RESPONSE_TOKENS[task])
    config.rollout.sampling.temperature = 0.6  # rollout.temperature=0.6 [P, DR]
    config.train.update(dict(
        batch_size=64,  # data.train_batch_size=64 [P, DR]
        checkpoint_every=100, eval_every=50))
    rl = config.rl
    rl.advantage, rl.gamma, rl.lam = "gae", 1.0, 1.0  # gae, gamma and lam 1.0 [DR ppo_trainer.yaml]
    rl.minibatch_size, rl.micro_batch_size = 16, 8  # ppo_mini_batch_size=16 [DR]; micro-batch: memory only
    rl.actor.lr = 1e-6  # actor.optim.lr=1e-6 [P, DR]
    rl.critic.lr = 1e-5  # critic.optim.lr=1e-5 [P, DR]
    rl.entropy_coef = 0.001  # Eq. 3's entropy bonus [P]; actor.entropy_coeff: 0.001 [DR ppo_trainer.yaml]
    rl.shuffle = False  # batch.split(ppo_mini_batch_size), in order [DR verl/workers/actor/dp_actor.py]
    rl.use_reference = True
    rl.kl_in_reward = True  # algorithm.kl_ctrl.kl_coef=0.001: verl's KL penalty in the reward [P, DR]
    rl.kl_coef = 0.001
    rl.kl_reward_estimator = "kl"  # kl_penalty: kl [DR ppo_trainer.yaml]
    rl.compute_dtype = "bfloat16"
    rl.remat = True  # enable_gradient_checkpointing=True [DR]
    config.mesh.update(dict(data=1, fsdp=-1, tensor=1))
    return config


def _lengths(config, prompt_tokens: int, response_tokens: int):
    """data.max_prompt_length and data.max_response_length of a run (one turn: the response is the turn)."""
    config.rollout.update(dict(max_prompt_tokens=prompt_tokens, max_turn_tokens=response_tokens,
                               max_len=prompt_tokens + response_tokens, obs_buckets=(8,), max_obs_tokens=8))


def _prompt(config, prompt: prompts.TaskPrompt):
    """A dataset's own public prompt in place of its family's (for the reasoning setting the config holds)."""
    config.env.update(dict(system=prompt.system, user_template=prompt.user,
                           assistant_prefix=prompt.assistant))


def literature(config):
    config = _paper(config, "literature")
    config.data.update(dict(format="literature", dir="/data/deepretrieval", train="pubmed", eval="pubmed"))
    config.retrieval.kind = "pubmed"  # its cache asks the engine once per query
    config.retrieval.options = to_config(PubMedOptions(cache_path="/data/cache/pubmed.jsonl"))
    config.env.depth = 3000  # search_with_keywords(topk=3000), Recall@3K [P, DR pubmed.py]
    return config


def literature_ctgov(config):
    config = literature(config)
    config.data.update(dict(train="ctgov", eval="ctgov"))
    config.retrieval.kind = "ctgov"
    config.retrieval.options = to_config(ClinicalTrialsOptions(cache_path="/data/cache/ctgov.jsonl"))
    return config


def evidence_nq(config):
    """NQ [DR scripts/train/nq.sh]: batch 64, minibatch 16, 512 response tokens, verl's temperature 1.0."""
    config = _paper(config, "evidence")
    config.data.update(dict(format="qa", dir="/data/flashrag", train="nq", eval="nq", eval_split="test"))
    # pyserini's Lucene index [DR nq_serini.py]
    config.retrieval.index_dir = "/data/indexes/wikipedia-dpr-100w"
    config.env.depth = 3000  # answer-rank tiers up to rank 3000 [DR squad.py]
    _lengths(config, 256, 512)  # max_prompt_length=256, max_response_length=512 [DR nq.sh]
    config.rollout.sampling.temperature = 1.0  # nq.sh sets none: temperature: 1.0 [DR ppo_trainer.yaml]
    config.train.update(dict(checkpoint_every=50, eval_every=50))  # save_freq=50, test_freq=50 [DR nq.sh]
    _prompt(config, prompts.evidence_prompt("nq", config.env.reasoning))  # [DR data_preprocess/nq_serini.py]
    return config


def _from_nq(config, dataset):
    """TriviaQA and SQuAD continue from the NQ run, actor and critic [DR triviaqa.sh:40-41, squad.sh:39-40:
    actor_rollout_ref.model.path and critic.model.path .../nq_serini_3b/{actor,critic}/global_step_1800]:
    `python -m searchrl.checkpoint export --checkpoint runs/evidence_nq --step 1800 --out
    /data/models/deepretrieval_nq_step1800` writes both (the critic in its critic/)."""
    config = evidence_nq(config)
    config.model.path = "/data/models/deepretrieval_nq_step1800"  # actor init [DR]
    config.model.critic_path = "/data/models/deepretrieval_nq_step1800/critic"  # critic init [DR]
    config.data.update(dict(train=dataset, eval=dataset))
    _lengths(config, 256, 350)  # max_prompt_length=256, max_response_length=350 [DR triviaqa.sh, squad.sh]
    _prompt(config, prompts.evidence_prompt(dataset, config.env.reasoning))  # [DR data_preprocess/<d>.py]
    return config


def evidence_triviaqa(config):
    """TriviaQA [DR scripts/train/triviaqa.sh]: from NQ, 350 response tokens, temperature 0.6."""
    config = _from_nq(config, "triviaqa")
    config.rollout.sampling.temperature = 0.6  # rollout.temperature=0.6 [DR triviaqa.sh]
    return config


def evidence_squad(config):
    """SQuAD [DR scripts/train/squad.sh]: from NQ, batch 72, minibatch 18 (its 6 GPUs), verl's temperature
    1.0, evaluated on FlashRAG's squad dev split (it has no test split; [DR data_preprocess/squad.py] reads a
    raw test.jsonl it does not say how it made)."""
    config = _from_nq(config, "squad")
    config.data.eval_split = "dev"
    config.train.batch_size = 72  # data.train_batch_size=72 [DR squad.sh]
    config.rl.minibatch_size = 18  # ppo_mini_batch_size=18 [DR squad.sh]
    config.rl.micro_batch_size = 6  # ppo_micro_batch_size=6 [DR squad.sh]
    return config


def _classic(config, dataset: str, dense: bool):
    """A BEIR dataset (or an MS MARCO subset) with BM25 or its paper's dense encoder, and its own prompt."""
    config = _paper(config, "classic")
    # Evaluated on BEIR's test qrels [DR src/eval/BM25/msmarco_beir.py: qrels/test.tsv; data_preprocess/]
    config.data.update(dict(format="beir", dir="/data/beir", train=dataset, eval=dataset, eval_split="test"))
    retriever = "dense" if dense else "bm25"
    encoder = DENSE_ENCODERS[dataset][0].split("/")[-1] if dense else ""
    corpus = "msmarco" if dataset in SUBSETS else dataset  # the subsets search all of MS MARCO's passages
    config.retrieval.index_dir = f"/data/indexes/{corpus}_{encoder or retriever}"
    config.env.depth = 3000  # retriver_items(top_k=3000), NDCG@3000 [DR reward_score/msmarco_beir.py]
    if dataset in SUBSETS:
        _prompt(config, prompts.msmarco_subset_prompt(retriever, config.env.reasoning))  # [DR msmarco_sub.py]
    else:
        _prompt(config, prompts.beir_prompt(dataset, retriever, config.env.reasoning))  # [DR data_preprocess]
    return config


def classic_msmarco(config, dense: bool = False):
    """MS MARCO (BEIR) [DR scripts/train/msmarco_beir.sh; dense/msmarco_beir.sh]."""
    config = _classic(config, "msmarco", dense)
    if not dense:
        config.train.batch_size = 512  # data.train_batch_size=512 [DR msmarco_beir.sh]
        config.rl.minibatch_size = 128  # ppo_mini_batch_size=128 [DR msmarco_beir.sh]
    return config


def _beir(dataset):
    def preset(config, dense: bool = False):
        config = _classic(config, dataset, dense)
        if dataset == "scifact":
            # ppo_mini_batch_size=128 > data.train_batch_size=64 [DR scifact.sh, dense/scifact.sh]: verl's
            # batch.split(128) makes one minibatch of the whole batch.
            config.rl.minibatch_size = 64
        return config
    preset.__doc__ = f"{dataset} [DR scripts/train/{dataset}.sh; dense/{dataset}.sh]: batch 64."
    return preset


def _subset(dataset):
    def preset(config, dense: bool = False):
        """An MS MARCO domain subset [DR scripts/train/msmarco.sh (BM25), msmarco_dense.sh (Contriever)],
        evaluated on its test split (the public dev.jsonl); `prepare msmarco_subsets` builds it."""
        config = _classic(config, dataset, dense)
        # max_response_length=350 [DR msmarco.sh], 512 [DR msmarco_dense.sh]
        _lengths(config, 256, 512 if dense else 350)
        return config
    return preset


CLASSIC = {"msmarco": classic_msmarco, **{d: _beir(d) for d in ("nfcorpus", "fever", "hotpotqa", "scifact")},
           **{d: _subset(d) for d in SUBSETS}}


def sql(config):
    """Spider [DR scripts/train/spider.sh]: trained on train_spider + train_others (`prepare spider_train`),
    evaluated on Spider's test set (val_files=.../spider/test.parquet) with its test_database/."""
    config = _paper(config, "sql")
    config.data.update(dict(format="spider", dir="/data/sql", train="spider", eval="spider",
                            eval_split="test"))
    # The optional cold start (`python -m searchrl.main ... sft`; RL: config.model.path=<workdir>/sft/epoch_1)
    # trains each item's "reasoning" (GPT-4o-distilled in the paper [P; DR src/cold_start/sql/
    # generate_data.py]) in <think> before its gold SQL, or with ,no_reasoning the gold SQL alone
    # [P; DR src/cold_start/sql/sft.py]: train_epoch 4, or 2 wo_reasoning; save_strategy='epoch', and the
    # paper keeps epoch 1 [P]; learning_rate=2e-5; per_device_train_batch_size=4 on CUDA_VISIBLE_DEVICES='2,3'
    # (batch 8 [P]); transformers' TrainingArguments defaults: lr_scheduler_type linear (to 0 at the last
    # step: decay_steps=0), no warmup, no weight decay, max_grad_norm 1.0.
    config.sft.update(dict(epochs=4 if config.env.reasoning else 2, save_epochs=(1,), batch_size=8,
                           max_len=PROMPT_TOKENS["sql"] + RESPONSE_TOKENS["sql"]))
    config.sft.optim.update(dict(lr=2e-5, warmup_steps=0, decay="linear", decay_steps=0, min_lr_ratio=0.0,
                                 weight_decay=0.0, clip_grad_norm=1.0))
    return config


def sql_coder7b(config):
    """`sql` on Qwen2.5-Coder-7B-Instruct, the paper's SQL model at 7B, trained on 4 A100-80GB [P, Appendix
    "Hardware"] (Qwen2.5-7B's architecture: preset qwen2p5_7b)."""
    config = sql(config)
    config.model.update(dict(preset="qwen2p5_7b", path="/data/models/Qwen2.5-Coder-7B-Instruct"))
    return config


def sql_bird(config):
    """BIRD [DR scripts/train/bird.sh], evaluated on its dev set (test.parquet is built from dev/dev.json
    [DR data_preprocess/bird.py]; BIRD's test set is hidden). bird.sh starts from a 7B coder model
    (INIT_MODEL=/dev/ana/qwen-7, EXP_NAME=bird_7b_coder); this preset keeps the 3B model of the other SQL
    runs: set config.model as sql_coder7b does for that run."""
    config = sql(config)
    config.data.update(dict(format="bird", train="bird", eval="bird", eval_split="dev"))
    config.env.reward.sql_executes_score = 0.3  # runs but returns other rows [DR bird.py]
    return config


def _tiny(config):
    """CPU size: a random tiny model, short prompts and responses, a few small steps, and the family's prompt
    (`prompts.PROMPTS`) rather than a dataset's."""
    config.model.update(dict(preset="tiny", path="", param_dtype="float32"))
    config.env.update(dict(chat_template=False, system="", user_template="", assistant_prefix=""))
    config.rl.update(dict(compute_dtype="float32", remat=False, minibatch_size=8, micro_batch_size=8))
    config.rl.actor.lr = config.rl.critic.lr = 1e-4
    config.rollout.update(dict(max_prompt_tokens=512, max_turn_tokens=24, max_len=512 + 24, chunk_steps=8))
    # a checkpoint every 100 steps and at the last (a miniature's workdir starts over: it never resumes one)
    config.train.update(dict(steps=2, batch_size=8, checkpoint_every=100, eval_every=0,
                             async_checkpoints=False))
    config.mesh.update(dict(data=-1, fsdp=1, tensor=1))
    return config


def tiny(config):
    """The miniature (`searchrl.tasks.deepretrieval.demo`): every size here fits a seed in ~7 minutes on 2
    cores. RL runs 400 steps: at 200, every seed's training reward was still rising when it stopped (its mean
    over the last 25 steps above the 25 before, on all five seeds of the first published record)."""
    config = _tiny(classic_msmarco(config))
    miniature_workdir(config, "runs/deepretrieval_demo")
    config.demo = to_config(RewriteDemoConfig())
    config.demo.parallel_seeds = 2  # on 2 cores a tiny model's step keeps about one busy
    config.data.update(dict(train="rewrite_world", eval="rewrite_world", eval_split="test"))
    config.retrieval.kind = "local"
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
    config.train.update(dict(steps=400, batch_size=32))
    config.rl.update(dict(minibatch_size=32, micro_batch_size=32, kl_in_reward=False, use_reference=False))
    config.rl.actor.lr = 3e-4
    config.rl.critic.lr = 1e-3
    return config


def smoke(config):
    """`tiny` at its smallest (`make smoke`, `python -m searchrl.demo --size smoke`): one seed end to end,
    compiling most of the time. It checks that the miniature runs, not what it learns."""
    config = tiny(config)
    config.workdir = "runs/smoke/deepretrieval"
    config.demo.update(dict(concepts_per_kind=8, sft_samples=1, seeds=(0,), parallel_seeds=1))
    config.sft.update(dict(steps=1, batch_size=8))  # one step: one compile
    config.sft.optim.update(dict(warmup_steps=0, decay="constant"))
    config.train.update(dict(steps=2, batch_size=8))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=8))
    return config


FAMILIES = {"literature": literature, "literature_ctgov": literature_ctgov, "evidence": evidence_nq,
            "classic": classic_msmarco, "classic_dense": lambda c: classic_msmarco(c, dense=True), "sql": sql,
            "sql_coder7b": sql_coder7b, "sql_bird": sql_bird}
DATASETS = {"evidence_nq": evidence_nq, "evidence_triviaqa": evidence_triviaqa,
            "evidence_squad": evidence_squad,
            **{f"classic_{name}": f for name, f in CLASSIC.items()},
            **{f"classic_{name}_dense": (lambda c, f=f: f(c, dense=True)) for name, f in CLASSIC.items()}}
PRESETS = {**FAMILIES, **DATASETS,
           **{f"tiny_{name}": (lambda c, f=f: _tiny(f(c))) for name, f in FAMILIES.items()}, "tiny": tiny,
           "smoke": smoke}

# The hardware setups (configs/hardware.py) the docs recommend for the paper presets, by the preset's model:
# the 3B on 2 A100s, the Coder-7B on 4 (compiled ahead of time by `python -m searchrl.benchmarks.aot_setups`).
PAPER_SETUPS = {"qwen2p5_3b": ("a100x2",), "qwen2p5_7b": ("a100x4",)}


def get_config(arg: str = "tiny"):
    name, setup = hardware.split(arg)
    preset, _, variant = name.partition(",")
    if preset not in PRESETS or variant not in ("", "no_reasoning"):
        raise ValueError(f"Unknown preset {arg!r} for configs/deepretrieval.py; expected one of "
                         f"{sorted(PRESETS)}, optionally followed by ',no_reasoning' and ',<setup>' "
                         f"({sorted(hardware.SETUPS)})")
    config = run_config.experiment_config("deepretrieval")
    config.env.reasoning = not variant  # before the preset: a dataset's prompt depends on it
    config = PRESETS[preset](config)
    config.train.epochs = EPOCHS.get(EPOCHS_OF.get(preset, preset), (0, ""))[0]  # tiny presets: train.steps
    return run_config.preset_workdir(hardware.apply(config, setup), __file__, name)
