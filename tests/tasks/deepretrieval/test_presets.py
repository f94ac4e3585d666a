"""DeepRetrieval's presets against the public runs (github.com/pat-jj/DeepRetrieval, under code/): every value
below was read in the file named with it. The prompts are checked against the public scripts' own texts:
tests/tasks/deepretrieval/public_prompts.json holds, per data_preprocess file, what its make_prefix returns
for the query "{question}" (and for retrieval_mode "sparse" / "dense" where it takes one)."""
import json
import os
import re
import sys

import numpy as np
import pytest

from searchrl.configlib import from_config
from searchrl.rl.config import SFTConfig, TrainConfig
from searchrl.rl.optim import learning_rate
from tests.app.test_presets import ROOT, same, value

sys.path.insert(0, os.path.join(ROOT, "configs"))

import deepretrieval  # noqa: E402

DR = "pat-jj/DeepRetrieval:code/"
YAML = DR + "verl/trainer/config/ppo_trainer.yaml"
ACTOR = DR + "verl/workers/actor/dp_actor.py"
TRAIN = DR + "scripts/train/"
PREPROCESS = DR + "data_preprocess/"
PUBLIC_PROMPTS = os.path.join(os.path.dirname(__file__), "public_prompts.json")

# verl's defaults the scripts leave unset, and what every script sets alike.
VERL = [
    (YAML, "actor.entropy_coeff: 0.001 (Eq. 3's entropy bonus)", "rl.entropy_coef", 0.001),
    (YAML, "actor.clip_ratio: 0.2", "rl.clip_ratio_low", 0.2),
    (YAML, "actor.clip_ratio: 0.2", "rl.clip_ratio_high", 0.2),
    (YAML, "actor.ppo_epochs: 1", "rl.ppo_epochs", 1),
    (YAML, "actor.grad_clip: 1.0", "rl.actor.clip_grad_norm", 1.0),
    (YAML, "critic.grad_clip: 1.0", "rl.critic.clip_grad_norm", 1.0),
    (YAML, "critic.cliprange_value: 0.5", "rl.value_clip", 0.5),
    (YAML, "algorithm.gamma: 1.0", "rl.gamma", 1.0),
    (YAML, "algorithm.lam: 1.0", "rl.lam", 1.0),
    (YAML, "algorithm.adv_estimator: gae", "rl.advantage", "gae"),
    (YAML, "algorithm.kl_penalty: kl", "rl.kl_reward_estimator", "kl"),
    (YAML, "actor.use_kl_loss: False: the KL penalty goes into the reward", "rl.kl_in_reward", True),
    (ACTOR, "update_policy: batch.split(ppo_mini_batch_size), in order", "rl.shuffle", False),
]


def script(name, batch=64, minibatch=16, prompt=256, response=512, temperature=0.6,
           model="Qwen2.5-3B-Instruct"):
    """The rows every train script sets, with its own values."""
    source = TRAIN + name
    return [
        (source, f"data.train_batch_size={batch}", "train.batch_size", batch),
        (source, f"actor_rollout_ref.actor.ppo_mini_batch_size={minibatch}", "rl.minibatch_size", minibatch),
        (source, f"data.max_prompt_length={prompt}", "rollout.max_prompt_tokens", prompt),
        (source, f"data.max_response_length={response}", "rollout.max_turn_tokens", response),
        (source, "prompt + response", "rollout.max_len", prompt + response),
        (source, "actor_rollout_ref.actor.optim.lr=1e-6", "rl.actor.lr", 1e-6),
        (source, "critic.optim.lr=1e-5", "rl.critic.lr", 1e-5),
        (source, "algorithm.kl_ctrl.kl_coef=0.001", "rl.kl_coef", 0.001),
        (source, f"rollout.temperature={temperature} (1.0: unset, ppo_trainer.yaml's)",
         "rollout.sampling.temperature", temperature),
        (source, "enable_gradient_checkpointing=True", "rl.remat", True),
        (source, f"actor_rollout_ref.model.path=...{model}", "model.path", f"/data/models/{model}"),
        *VERL,
    ]


def data(source, dataset, split, fmt):
    return [(source, f"data.val_files=.../{split}", "data.eval_split", split),
            (source, f"data.train_files=.../{dataset}/...", "data.train", dataset),
            (source, f"data.val_files=.../{dataset}/...", "data.eval", dataset),
            (source, f"{fmt} data", "data.format", fmt)]


NQ_MODEL = "deepretrieval_nq_step1800"  # the NQ run's actor and critic at global_step_1800


def from_nq(name, line):
    """The critic of TriviaQA and SQuAD: the NQ run's, as `checkpoint export` writes it beside the actor."""
    return [(f"{TRAIN}{name}:{line}", "critic.model.path=.../nq_serini_3b/critic/global_step_1800",
             "model.critic_path", f"/data/models/{NQ_MODEL}/critic")]


PUBLIC_RUNS = {
    "evidence_nq": [*script("nq.sh", temperature=1.0), *data(TRAIN + "nq.sh", "nq", "test", "qa")],
    "evidence_triviaqa": [*script("triviaqa.sh", response=350, model=NQ_MODEL), *from_nq("triviaqa.sh", 41),
                          *data(TRAIN + "triviaqa.sh", "triviaqa", "test", "qa")],
    "evidence_squad": [*script("squad.sh", batch=72, minibatch=18, response=350, temperature=1.0,
                              model=NQ_MODEL), *from_nq("squad.sh", 40),
                       *data(TRAIN + "squad.sh", "squad", "dev", "qa")],
    "classic_msmarco": [*script("msmarco_beir.sh", batch=512, minibatch=128),
                        *data(DR + "src/eval/BM25/msmarco_beir.py", "msmarco", "test", "beir")],
    "classic_msmarco_dense": [*script("dense/msmarco_beir.sh"),
                              *data(DR + "src/eval/Dense/msmarco_beir.py", "msmarco", "test", "beir")],
    **{f"classic_{d}{suffix}": [*script(f"{folder}{d}.sh", minibatch=64 if d == "scifact" else 16),
                                *data(f"{PREPROCESS}{folder}{d}.py (qrels/test.tsv)", d, "test", "beir")]
       for d in ("nfcorpus", "fever", "hotpotqa", "scifact")
       for suffix, folder in (("", ""), ("_dense", "dense/"))},
    **{f"classic_msmarco_{d}": [*script("msmarco.sh", response=350),
                                *data(TRAIN + "msmarco.sh", f"msmarco_{d}", "test", "beir")]
       for d in ("health", "science", "tech")},
    **{f"classic_msmarco_{d}_dense": [*script("msmarco_dense.sh"),
                                      *data(TRAIN + "msmarco_dense.sh", f"msmarco_{d}", "test", "beir")]
       for d in ("health", "science", "tech")},
    "sql": [*script("spider.sh", prompt=2048), *data(TRAIN + "spider.sh", "spider", "test", "spider")],
    "sql_bird": [*[row for row in script("bird.sh", prompt=2048) if row[2] != "model.path"],
                 (DR + "data_preprocess/bird.py", "test.parquet from dev/dev.json", "data.eval_split", "dev"),
                 (TRAIN + "bird.sh", "data.train_files=data/sql/bird/train.parquet", "data.train", "bird")],
}
# ppo_mini_batch_size=128 over a batch of 64: verl's batch.split(128) makes one minibatch of the 64.
SCIFACT_MINIBATCH = (TRAIN + "scifact.sh", "ppo_mini_batch_size=128 > train_batch_size=64", 64)
PUBLIC_SCRIPTS = os.path.join(os.path.dirname(__file__), "public_scripts.json")  # lines, verbatim
DENSE = DR + "verl/utils/reward_score_dense/"
ENCODERS = {  # dataset: (source, what it says, encoder, pooling)
    **{d: (f"{DENSE}{f}.py", "faiss-flat.*.bge-base-en-v1.5 index", "BAAI/bge-base-en-v1.5", "cls")
       for d, f in (("msmarco", "msmarco_beir"), ("nfcorpus", "nfcorpus"), ("fever", "fever"),
                    ("hotpotqa", "hotpotqa"))},
    "scifact": (DR + "src/Dense/scifact/1_convert_emb.py", "MODEL_NAME = <the encoder>",
                "intfloat/multilingual-e5-large-instruct", "mean"),
    **{f"msmarco_{d}": (DR + "src/eval/Dense/msmarco_sub.py", "facebook/contriever, pooling='mean'",
                        "facebook/contriever", "mean") for d in ("health", "science", "tech")},
}


def prompt_source(preset: str, reasoning: bool) -> str:
    """The public data_preprocess file (and retrieval mode) whose prompt `preset` uses."""
    name = preset.split("_", 1)[1].removesuffix("_dense")
    dense = preset.endswith("_dense")
    if preset.startswith("evidence"):
        stem = "nq_serini" if name == "nq" else name
        return PREPROCESS + (f"{stem}.py" if reasoning else f"no_reason/Evidence/{stem}.py")
    if name.startswith("msmarco_"):
        file = "msmarco_sub.py" if reasoning else "no_reason/BM25/msmarco_sub.py"
        return f"{PREPROCESS}{file}:{'dense' if dense else 'sparse'}"
    stem = "msmarco_beir" if name == "msmarco" else name
    if reasoning:
        return f"{PREPROCESS}{'dense/' if dense else ''}{stem}.py"
    return f"{PREPROCESS}no_reason/{'Dense' if dense else 'BM25'}/{stem}.py"


def _flat(text: str) -> str:
    """Whitespace-collapsed, without the hand-written chat markup around the assistant's first words."""
    text = re.sub(r"<\|im_end\|>|<\|im_start\|>assistant:?|Assistant:", " ", text)
    return " ".join(text.split())


@pytest.mark.parametrize("preset", sorted(PUBLIC_RUNS))
def test_dataset_preset_matches_its_public_script(preset):
    config = deepretrieval.get_config(preset)
    rows = PUBLIC_RUNS[preset]
    if preset.startswith("classic_scifact"):
        source, setting, minibatch = SCIFACT_MINIBATCH
        rows = [row for row in rows if row[2] != "rl.minibatch_size"] + [
            (source, setting, "rl.minibatch_size", minibatch)]
    wrong = [f"{key}={value(config, key)!r}, but {source} has {setting} -> {expected!r}"
             for source, setting, key, expected in rows if not same(value(config, key), expected)]
    assert not wrong, "\n".join(wrong)


def public_line(path: str) -> str:
    """The line `path` (file:line under code/) of pat-jj/DeepRetrieval, as public_scripts.json holds it verbatim."""
    with open(PUBLIC_SCRIPTS, encoding="utf-8") as f:
        return json.load(f)["lines"][f"code/{path}"]


@pytest.mark.parametrize("preset", sorted(set(deepretrieval.PRESETS) - {"tiny", "smoke"}))  # CPU miniatures
def test_every_preset_runs_the_epochs_of_its_cited_script_line(preset):
    """The length of each paper preset is the trainer.total_epochs of the script line it cites; tiny presets
    count steps."""
    config = deepretrieval.get_config(preset)
    if preset.startswith("tiny_"):
        assert config.train.epochs == 0 and config.train.steps == 2
        return
    epochs, cited = deepretrieval.EPOCHS[deepretrieval.EPOCHS_OF.get(preset, preset)]
    line = public_line(f"scripts/train/{cited}")
    assert re.search(r"trainer\.total_epochs=(\d+)\b", line).group(1) == str(epochs) == str(config.train.epochs)


def test_epochs_count_updates_as_verls_drop_last_dataloader():
    """ray_trainer.py: len(train_dataloader) * total_epochs, the dataloader dropping the last partial batch."""
    assert "drop_last=True" in public_line("verl/trainer/ppo/ray_trainer.py:587")
    assert "len(self.train_dataloader) * self.config.trainer.total_epochs" in public_line(
        "verl/trainer/ppo/ray_trainer.py:610")
    train = from_config(TrainConfig, deepretrieval.get_config("literature").train, "config.train")
    assert (train.epochs, train.batch_size) == (10, 64)
    assert train.num_steps(12801) == 10 * 200  # Table 4: 12,801 PubMed training queries
    assert from_config(TrainConfig, deepretrieval.get_config("sql").train, "config.train").num_steps(8659) == 5 * 135
    with pytest.raises(ValueError, match="train.epochs=10 over 63 training questions"):
        train.num_steps(63)


@pytest.mark.parametrize("dataset", sorted(ENCODERS))
def test_dense_presets_name_the_papers_encoder(dataset):
    source, setting, encoder, pooling = ENCODERS[dataset]
    assert deepretrieval.DENSE_ENCODERS[dataset] == (encoder, pooling), f"{source}: {setting}"
    corpus = "msmarco" if dataset.startswith("msmarco") else dataset  # MS MARCO's passages for the subsets
    config = deepretrieval.get_config(f"classic_{dataset}_dense")
    assert config.retrieval.index_dir == f"/data/indexes/{corpus}_{encoder.split('/')[-1]}"
    sparse = deepretrieval.get_config(f"classic_{dataset}")
    assert sparse.retrieval.index_dir == f"/data/indexes/{corpus}_bm25"


@pytest.mark.parametrize("reasoning", [True, False], ids=["reasoning", "no_reasoning"])
@pytest.mark.parametrize("preset", sorted(p for p in deepretrieval.DATASETS))
def test_dataset_preset_prompts_are_the_public_scripts(preset, reasoning):
    """System message and user message up to the query exactly; the rest up to whitespace and the markup."""
    with open(PUBLIC_PROMPTS, encoding="utf-8") as f:
        public = json.load(f)[prompt_source(preset, reasoning)]
    env = deepretrieval.get_config(preset + ("" if reasoning else ",no_reasoning")).env
    assert env.reasoning is reasoning
    system = public.split("<|im_start|>system\n")[1].split("<|im_end|>")[0]
    user = public.split("<|im_start|>user\n")[1]
    before, after = user.split("{question}")
    assert env.system == system
    assert env.user_template.split("{question}")[0] == before
    rest = env.user_template.split("{question}")[1] + "\nAssistant: " + env.assistant_prefix
    assert _flat(rest) == _flat(after)


def test_dense_presets_ask_for_an_expansion_and_sparse_ones_for_boolean_queries():
    for dataset in ("msmarco", "nfcorpus", "fever", "hotpotqa", "scifact"):
        sparse = deepretrieval.get_config(f"classic_{dataset}").env.user_template
        dense = deepretrieval.get_config(f"classic_{dataset}_dense").env.user_template
        assert "Boolean operators" in sparse and "Boolean" not in dense
        assert "expanding it with additional semantically relevant information" in dense


def test_the_family_presets_are_their_msmarco_and_nq_datasets():
    for family, dataset in (("evidence", "evidence_nq"), ("classic", "classic_msmarco"),
                            ("classic_dense", "classic_msmarco_dense")):
        a, b = deepretrieval.get_config(family), deepretrieval.get_config(dataset)
        a.workdir = b.workdir
        assert a.to_dict() == b.to_dict(), family


COLD_START = DR + "src/cold_start/sql/sft.py"
# transformers' TrainingArguments defaults, which the script's trl SFTConfig leaves unset.
HF_DEFAULTS = [(COLD_START, "lr_scheduler_type='linear' (to 0 at the end)", "sft.optim.decay", "linear"),
               (COLD_START, "linear to 0 over all steps", "sft.optim.decay_steps", 0),
               (COLD_START, "linear to 0", "sft.optim.min_lr_ratio", 0.0),
               (COLD_START, "warmup_steps=0", "sft.optim.warmup_steps", 0),
               (COLD_START, "weight_decay=0.0", "sft.optim.weight_decay", 0.0),
               (COLD_START, "max_grad_norm=1.0", "sft.optim.clip_grad_norm", 1.0),
               (COLD_START, "adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8", "sft.optim.b1", 0.9),
               (COLD_START, "adam_beta2=0.999", "sft.optim.b2", 0.999),
               (COLD_START, "adam_epsilon=1e-8", "sft.optim.eps", 1e-8)]
COLD_START_RUNS = {  # preset: the script's train_epoch for its wo_reasoning setting
    reasoning: [(COLD_START, f"train_epoch = {epochs:g} (wo_reasoning = {not reasoning})", "sft.epochs",
                 epochs),
                (COLD_START, "learning_rate=2e-5", "sft.optim.lr", 2e-5),
                (COLD_START, "per_device_train_batch_size=4 on CUDA_VISIBLE_DEVICES='2,3' (batch 8 [P])",
                 "sft.batch_size", 8),
                (COLD_START, "save_strategy='epoch'; the paper keeps epoch 1", "sft.save_epochs", (1,)),
                *HF_DEFAULTS]
    for reasoning, epochs in ((True, 4.0), (False, 2.0))}


@pytest.mark.parametrize("reasoning", [True, False], ids=["reasoning", "no_reasoning"])
@pytest.mark.parametrize("preset", ["sql", "sql_bird", "sql_coder7b"])
def test_sql_cold_start_is_the_public_sft_and_keeps_epoch_one(preset, reasoning):
    config = deepretrieval.get_config(preset + ("" if reasoning else ",no_reasoning"))
    wrong = [f"{key}={value(config, key)!r}, but {source} has {setting} -> {expected!r}"
             for source, setting, key, expected in COLD_START_RUNS[reasoning]
             if not same(value(config, key), expected)]
    assert not wrong, "\n".join(wrong)
    sft = from_config(SFTConfig, config.sft.to_dict(), "config.sft")
    # Spider's 7000 + 1659 training questions: 1083 minibatches of 8 an epoch, the rate linear to 0.
    assert (sft.steps_per_epoch(8659), sft.num_steps(8659)) == (1083, 1083 * sft.epochs)
    total, rate = sft.num_steps(8659), learning_rate(sft.schedule(8659))
    steps = np.array([0, 1, 1082, 1083, total - 1, total])  # epoch 1's last step, the run's last step
    hf = 2e-5 * (total - steps) / total  # transformers' get_linear_schedule_with_warmup, no warmup
    np.testing.assert_allclose([float(rate(i)) for i in steps], hf, rtol=1e-6, atol=1e-12)
    assert "config.model.path=<workdir>/sft/epoch_1" in deepretrieval.__doc__
