"""The evaluation harness: metric aggregation and depth arithmetic checked by hand, report files, and greedy
runs end to end (library and CLI) of a tiny random policy over a tiny BM25 world made here."""
from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from searchrl import checkpoint, experiment, models, run_config, task
from searchrl.data import datasets
from searchrl.episode import Action, Env, Trajectory, Turn
from searchrl.eval import harness, report
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.rl import train_state
from searchrl.rl.config import OptimConfig
from searchrl.rollout.config import RolloutConfig
from searchrl.tasks.autosearch import analysis as autosearch_analysis
from searchrl.tasks.autosearch import env as autosearch_env
from searchrl.tasks.autosearch.env import INTERMEDIATE_ANSWER, AutoSearchEnv
from searchrl.tasks.rpl import analysis as rpl_analysis
from searchrl.tasks.search_r1 import env as search_env
from searchrl.text.tokenizer import train_bpe_tokenizer

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PASSAGES = [
    ("Paris", "Paris is the capital of France."),
    ("France", "France is a country in Europe whose capital is Paris."),
    ("Seine", "The Seine is the river that flows through Paris."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Spree", "The Spree is the river that flows through Berlin."),
    ("Rome", "Rome is the capital of Italy."),
]
QUESTIONS = {
    "world": [("What is the capital of France?", ["Paris"], 1),
              ("Which river flows through the capital of France?", ["Seine"], 2),
              ("What is the capital of Germany?", ["Berlin"], 1),
              ("Which river flows through the capital of Germany?", ["Spree"], 2),
              ("What is the capital of Italy?", ["Rome"], 1)],
    "trivia": [("Which city is the capital of Italy?", ["Rome"], None),
               ("Which country has Paris as its capital?", ["France"], None),
               ("Which river flows through Berlin?", ["Spree"], None)],
}


# ---- Hand-checked arithmetic ----

def row(dataset, em, f1, searches, depth=None, hops=None, cover_em=None):
    return {"dataset": dataset, "hops": hops, "em": em, "f1": f1, "searches": searches, "depth": depth,
            "cover_em": em if cover_em is None else cover_em}


LABELS = autosearch_analysis.REPORT.labels  # hops and depth describe a question, they are no metrics
ROWS = [row("a", 1.0, 1.0, 2, depth=1, hops=1), row("a", 0.0, 0.5, 1, hops=2, cover_em=1.0),
        row("a", 1.0, 1.0, 3, depth=3, hops=2), row("a", 0.0, 0.0, 0, hops=2),
        row("b", 1.0, 1.0, 0, depth=0), row("b", 0.0, 0.25, 4)]


def test_results_table_by_hand():
    table = report.results_table(ROWS, LABELS)
    assert [t["dataset"] for t in table] == ["a", "b", report.AVERAGE]
    a, b, avg = table
    assert a["n"] == 4 and a["em"] == pytest.approx(0.5) and a["f1"] == pytest.approx(2.5 / 4)
    assert a["cover_em"] == pytest.approx(0.75) and a["searches"] == pytest.approx(1.5)
    assert b["n"] == 2 and b["em"] == pytest.approx(0.5) and b["f1"] == pytest.approx(0.625)
    assert b["searches"] == pytest.approx(2.0)
    # the papers' average: unweighted over datasets, not pooled over questions
    assert avg["n"] == 6 and avg["f1"] == pytest.approx((0.625 + 0.625) / 2)
    assert avg["searches"] == pytest.approx((1.5 + 2.0) / 2)
    hops = report.group_table(ROWS, "hops", LABELS)
    assert [(h["dataset"], h["hops"], h["n"]) for h in hops] == [("a", 1, 1), ("a", 2, 3)]
    assert hops[1]["em"] == pytest.approx(1 / 3) and hops[1]["f1"] == pytest.approx(1.5 / 3)
    assert hops[1]["searches"] == pytest.approx(4 / 3)


def test_task_types_table_by_hand():
    """RPL's Table 3: rows grouped by (dataset, task type), each metric averaged; no table without types."""
    rows = [{"dataset": "globalqa", "task_type": "count", "answer_f1": 1.0, "doc_f1": 0.5},
            {"dataset": "globalqa", "task_type": "topk", "answer_f1": 0.0, "doc_f1": 0.25},
            {"dataset": "globalqa", "task_type": "count", "answer_f1": 0.5, "doc_f1": 1.0},
            {"dataset": "nq", "task_type": "qa", "answer_f1": 0.25, "doc_f1": 0.0}]
    assert report.group_table(rows, "task_type") == [
        {"dataset": "globalqa", "task_type": "count", "n": 2, "answer_f1": 0.75, "doc_f1": 0.75},
        {"dataset": "globalqa", "task_type": "topk", "n": 1, "answer_f1": 0.0, "doc_f1": 0.25},
        {"dataset": "nq", "task_type": "qa", "n": 1, "answer_f1": 0.25, "doc_f1": 0.0}]
    text = report.markdown(report.aggregate(rows, spec=rpl_analysis.REPORT), rpl_analysis.REPORT)
    assert "## By task type" in text and "| globalqa | count | 2 | 0.750 | 0.750 |" in text
    assert report.group_table([{"dataset": "nq", "em": 1.0}], "task_type") == []


def test_depth_distribution_by_hand():
    depth = autosearch_analysis.depth_distribution(ROWS, max_depth=4)
    assert depth["buckets"] == ["0", "1", "2", "3", "4", "never"]
    a, b, pooled = depth["datasets"]
    assert a["counts"] == {"0": 0, "1": 1, "2": 0, "3": 1, "4": 0, "never": 2}
    assert b["counts"] == {"0": 1, "1": 0, "2": 0, "3": 0, "4": 0, "never": 1}
    assert pooled["dataset"] == report.ALL and pooled["n"] == 6 and sum(pooled["counts"].values()) == 6
    assert pooled["fractions"]["never"] == pytest.approx(0.5)
    hops = [(h["hops"], h["counts"]["never"], h["counts"]["3"]) for h in depth["hops"]]
    assert hops == [(1, 0, 0), (2, 2, 1)]
    with pytest.raises(ValueError, match="outside 0..2"):
        autosearch_analysis.depth_distribution(ROWS, max_depth=2)


def test_budget_curves_by_hand():
    runs = {0: [row("a", 0.0, 0, 0, hops=1), row("a", 0.0, 0, 0, hops=2), row("b", 1.0, 1, 0)],
            2: [row("a", 1.0, 1, 1, hops=1), row("a", 0.0, 0, 2, hops=2), row("b", 1.0, 1, 0)]}
    curves = report.budget_curves(runs, autosearch_analysis.REPORT)
    assert curves["budgets"] == [0, 2]
    by_name = {c["dataset"]: c for c in curves["datasets"]}
    assert by_name["a"]["em"] == [0.0, 0.5] and by_name["b"]["em"] == [1.0, 1.0]
    assert by_name[report.AVERAGE]["em"] == [0.5, 0.75]
    assert by_name["a"]["searches"] == [0.0, 1.5]
    assert [(h["hops"], h["em"]) for h in curves["by"]["hops"]] == [(1, [0.0, 1.0]), (2, [0.0, 0.0])]


class ReplayEngine:
    """Stands in for a rollout engine: returns a crafted trajectory (with one padding row to drop)."""

    def __init__(self, traj):
        self.traj = traj

    def run(self, params, examples, key, first_row=0):
        assert len(examples) == self.traj.batch_size and first_row == 0
        return self.traj


def test_question_rows_from_a_crafted_trajectory():
    answer = {INTERMEDIATE_ANSWER: "Paris </answer>"}
    turns = [[Turn(0, 1, "<search>capital of France</search>", Action("search", "capital of France"), "obs",
                   answer),
              Turn(1, 2, "<answer>Paris</answer>", Action("answer", "Paris", done=True))],
             [Turn(0, 1, "<search>x</search>", Action("search", "x"), "obs", {INTERMEDIATE_ANSWER: "Berlin"}),
              Turn(1, 2, "<search>y</search>",
                   Action("invalid", "search is disabled in the final turn", True))],
             [Turn(0, 1, "<answer>pad</answer>", Action("answer", "pad", done=True))]]
    zeros = np.zeros((3, 4), np.float32)
    traj = Trajectory(tokens=zeros.astype(np.int32), attention_mask=zeros > 0, loss_mask=zeros,
                      logprobs=zeros, prompt_lengths=np.zeros(3, np.int32), lengths=np.zeros(3, np.int32),
                      turns=turns, finish_reasons=["done", "done", "length"], side_branch=INTERMEDIATE_ANSWER)
    examples = [{"id": "q1", "question": "Capital of France?", "golden_answers": ["Paris"], "dataset": "w",
                 "metadata": {"hops": 1}},
                {"id": "q2", "question": "Capital of Germany?", "golden_answers": ["Berlin"], "dataset": "w"}]
    env = AutoSearchEnv(None, autosearch_env.Config(reward="search_r1"))
    first, second = harness.question_rows(env, ReplayEngine(traj), None, examples, batch_size=3)
    assert (first["answer"], first["em"], first["f1"], first["searches"], first["depth"], first["hops"]) == \
        ("Paris", 1.0, 1.0, 1, 1, 1)
    # no final answer, but the intermediate answer after search 1 was right
    assert (second["answer"], second["em"], second["searches"], second["depth"], second["hops"]) == \
        ("", 0.0, 1, 1, None)
    assert second["intermediate_answers"] == ["Berlin"] and second["finish_reason"] == "done"
    assert second["response"] == "<search>x</search>obs<search>y</search>"
    plain = ReplayEngine(dataclasses.replace(traj, side_branch=None))
    assert "depth" not in harness.question_rows(env, plain, None, examples, batch_size=3)[0]


def test_metrics_are_whatever_numbers_the_env_reports():
    rows = [{"dataset": "d", "id": 7, "hops": None, "recall": 0.5, "ok": True, "answer": "x", "depth": None},
            {"dataset": "d", "id": 8, "hops": None, "recall": 1.0, "ok": False, "answer": "y", "depth": 2}]
    assert report.metric_names(rows) == ["recall", "ok"]
    table = report.results_table(rows)
    assert table[0] == {"dataset": "d", "n": 2, "recall": 0.75, "ok": 0.5}
    assert "| d | 2 | 0.750 | 0.500 |" in report.main_markdown({"table": table})


def test_write_report_files(tmp_path):
    meta = {"checkpoint": "ckpt", "side_branch": INTERMEDIATE_ANSWER, "side_branch_prompt": "\n<answer>"}
    spec = autosearch_analysis.REPORT
    summary = report.aggregate(ROWS, {0: ROWS, 3: ROWS}, spec, {**meta, "max_turns": 4})
    paths = report.write_report({"meta": meta, **summary, "predictions": ROWS}, tmp_path / "out", spec)
    assert sorted(paths) == ["analysis.png", "predictions.jsonl", "results.csv", "results.json", "results.md"]
    with open(paths["results.csv"]) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["dataset", "hops", "n", "em", "f1", "searches", "cover_em"]
    assert [(r["dataset"], r["hops"]) for r in rows] == [("a", ""), ("b", ""), ("average", ""), ("a", "1"),
                                                          ("a", "2")]
    assert float(rows[0]["f1"]) == pytest.approx(0.625) and rows[2]["n"] == "6"
    saved = json.loads(paths["results.json"].read_text())
    assert "predictions" not in saved and saved["depth"]["datasets"][-1]["counts"]["never"] == 3
    assert len(paths["predictions.jsonl"].read_text().splitlines()) == len(ROWS)
    md = paths["results.md"].read_text()
    assert "| average | 6 | 0.500 | 0.625 | 1.750 | 0.625 |" in md
    assert "| em @ 0 | em @ 3 |" in md and '"\\n<answer>"' in md and "| a (2-hop) | 3 |" in md
    assert paths["analysis.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- A tiny world: corpus, BM25 index, datasets, tokenizer, random policy ----

def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    write_jsonl(root / "corpus.jsonl",
                [{"id": f"d{i}", "contents": f'"{t}"\n{text}'} for i, (t, text) in enumerate(PASSAGES)])
    BM25Retriever.build(root / "corpus.jsonl", root / "index", show_progress=False)
    for name, questions in QUESTIONS.items():
        write_jsonl(root / "data" / name / "test.jsonl",
                    [{"id": f"{name}{i}", "question": q, "golden_answers": golds,
                      "metadata": {} if hops is None else {"hops": hops}}
                     for i, (q, golds, hops) in enumerate(questions)])
    texts = [text for _, text in PASSAGES] + [q for qs in QUESTIONS.values() for q, _, _ in qs]
    tokenizer = train_bpe_tokenizer(texts * 20, vocab_size=320, out_dir=str(root / "tokenizer"))
    return root, tokenizer


def make_config(root):
    config = run_config.experiment_config("autosearch")
    config.workdir = str(root / "run")
    config.tokenizer = str(root / "tokenizer")
    config.data.dir = str(root / "data")
    config.data.eval = "world,trivia"
    config.retrieval.index_dir = str(root / "index")
    config.env.update(dict(max_turns=2, prompt_template="Question: {question}\n", reward="search_r1",
                           intermediate_answers=False, intermediate_answer_tokens=4))
    config.train.batch_size = 4
    config.rollout.update(dict(max_prompt_tokens=32, max_len=160, max_turn_tokens=8, max_obs_tokens=32,
                               obs_buckets=(32,), chunk_steps=8))
    return config


def tiny_policy(tokenizer, seed=0):
    """A random tiny model. Untied embeddings: with tied ones, greedy decoding of a random model repeats the
    last prompt token whatever the weights, and comparisons of outputs would prove nothing."""
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer),
                              eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    return cfg, models.init_params(cfg, jax.random.key(seed))


@dataclasses.dataclass
class AlwaysSearchEnv(AutoSearchEnv):
    """The search-QA env (real BM25 observations) with a policy stand-in's choice: every turn that may search
    searches, the final turn answers with its text. A random policy rarely writes a well-formed action; this
    makes searches, intermediate answers and budgets exercise the whole path with known counts."""

    def parse_action(self, turn_text, turn_index):
        if turn_index < self.max_turns:
            return Action("search", "capital river")
        return Action("answer", turn_text, done=True)


def rollout_config(config) -> RolloutConfig:
    return run_config.parse(config).rollout


def build_env(config) -> Env:
    run = run_config.parse(config)
    return task.build(run.task, run.env, run.retrieval)


def always_search_setup(root, tokenizer):
    """The tiny world's config, a tiny policy (its model config and params), an `AlwaysSearchEnv` of 2 turns
    over its index and its test questions."""
    config = make_config(root)
    cfg, params = tiny_policy(tokenizer)
    env_config = autosearch_env.Config(max_turns=2, prompt_template=config.env.prompt_template,
                                       reward="search_r1", intermediate_answer_tokens=4)
    env = AlwaysSearchEnv(BM25Retriever(root / "index"), env_config)
    data = datasets.load_examples(config.data.dir, config.data.eval, "test", config.data.format,
                                  config.data.tfds_dir)
    return config, cfg, params, env, data


def test_evaluate_policy_budgets_and_depth(world):
    root, tokenizer = world
    config, cfg, params, env, data = always_search_setup(root, tokenizer)
    results = harness.evaluate_policy(cfg, params, tokenizer, env, data, rollout_config(config), batch_size=4,
                                      budgets=[2, 0, 1], spec=autosearch_analysis.REPORT,
                                      placement=models.Placement.default(attention=ATTENTION))
    sizes = {name: len(qs) for name, qs in QUESTIONS.items()}
    predictions = results["predictions"]
    assert [p["dataset"] for p in predictions] == ["world"] * 5 + ["trivia"] * 3  # padded rows dropped
    table = {t["dataset"]: t for t in results["table"]}
    for name, n in sizes.items():
        mine = [p for p in predictions if p["dataset"] == name]
        assert table[name]["n"] == n
        assert table[name]["em"] == pytest.approx(np.mean([p["em"] for p in mine]))
        assert table[name]["f1"] == pytest.approx(np.mean([p["f1"] for p in mine]))
    for p in predictions:  # every allowed search was made, each followed by an intermediate answer
        assert p["searches"] == 2 and len(p["intermediate_answers"]) == 2 and p["finish_reason"] == "done"
        assert p["em"] == 0.0 or p["depth"] is not None  # a right final answer always has a depth
        assert p["depth"] is None or p["depth"] <= p["searches"]
    assert [(h["hops"], h["n"]) for h in results["by"]["hops"]] == [(1, 3), (2, 2)]
    curves = results["budgets"]
    assert curves["budgets"] == [0, 1, 2]
    for curve in curves["datasets"] + curves["by"]["hops"]:
        assert curve["searches"] == [0.0, 1.0, 2.0]
        assert len(curve["em"]) == 3 and all(0.0 <= em <= 1.0 for em in curve["em"])
    by_name = {c["dataset"]: c for c in curves["datasets"]}
    assert by_name["world"]["em"][2] == pytest.approx(table["world"]["em"])  # budget 2 is the main run
    depth = results["depth"]
    assert depth["buckets"] == ["0", "1", "2", "never"]
    for group in depth["datasets"] + depth["hops"]:
        assert sum(group["counts"].values()) == group["n"]
        assert sum(group["fractions"].values()) == pytest.approx(1.0)
    assert {g["dataset"]: g["n"] for g in depth["datasets"]} == {**sizes, report.ALL: 8}
    assert results["meta"]["side_branch"] == INTERMEDIATE_ANSWER
    assert results["meta"]["side_branch_prompt"] == autosearch_env.ANSWER_PROMPT
    # intermediate answers run on a side branch: without them the trajectories and answers are the same
    plain = harness.evaluate_policy(cfg, params, tokenizer, env, data, rollout_config(config), batch_size=4,
                                    side_branch=False, warmup=False, spec=autosearch_analysis.REPORT,
                                    placement=models.Placement.default(attention=ATTENTION))
    for field in ("response", "answer"):
        assert [p[field] for p in plain["predictions"]] == [p[field] for p in predictions]
    assert plain["depth"] is None and "depth" not in plain["predictions"][0]


def test_budget_runs_roll_out_the_first_questions(world, monkeypatch):
    root, tokenizer = world
    config, cfg, params, env, data = always_search_setup(root, tokenizer)
    rollout, rolled_out = rollout_config(config), []

    def counting_question_rows(run_env, engine, params, questions, *args):
        rolled_out.append((run_env.max_turns, [q["id"] for q in questions]))
        return question_rows(run_env, engine, params, questions, *args)

    question_rows = harness.question_rows
    monkeypatch.setattr(harness, "question_rows", counting_question_rows)
    common = dict(side_branch=False, warmup=False, spec=autosearch_analysis.REPORT,
                  placement=models.Placement.default(attention=ATTENTION))
    results = harness.evaluate_policy(cfg, params, tokenizer, env, data, rollout, batch_size=4,
                                      budgets=[0, 2], budget_questions=2, **common)
    first = {name: records[:2] for name, records in data.items()}
    ids = [r["id"] for records in data.values() for r in records]
    assert rolled_out == [(2, ids), (0, [r["id"] for records in first.values() for r in records])]
    assert len(results["predictions"]) == 8 and results["meta"]["budget_questions"] == 4
    # each budget's curve is an evaluation of the first questions alone; budget 2 reuses the main run's rows
    curves = {c["dataset"]: c for c in results["budgets"]["datasets"]}
    for budget, position in ((0, 0), (2, 1)):
        alone = harness.evaluate_policy(cfg, params, tokenizer, env.with_max_turns(budget), first, rollout,
                                        batch_size=4, **common)
        for row in alone["table"]:
            if row["dataset"] in first:
                for metric in ("em", "f1", "searches"):
                    assert curves[row["dataset"]][metric][position] == pytest.approx(row[metric], abs=1e-12)
    assert [curves[name]["searches"] for name in first] == [[0.0, 2.0]] * 2
    with pytest.raises(ValueError, match="budget_questions must be >= 1"):
        harness.evaluate_policy(cfg, params, tokenizer, env, data, rollout, 4, budgets=[0],
                                budget_questions=0, **common)


def saved_checkpoint(directory, cfg, params):
    """A trainer-format checkpoint (whole TrainState + model config) at step 3."""
    spec = train_state.StateSpec(cfg, OptimConfig(1e-3), rules=models.TRAIN_RULES)
    state = train_state.init_train_state(spec, models.make_mesh(-1, 1, 1), params, jax.random.key(0),
                                         kl_coef=0.0)
    with checkpoint.Checkpointer(directory, async_save=False) as ckpt:
        ckpt.save(3, state, model=cfg)


def assert_same_rollouts(got, want):
    assert all(p["response"] for p in want)  # the policy wrote something to compare
    for field in ("response", "answer", "searches", "finish_reason"):
        assert [p[field] for p in got] == [p[field] for p in want], field


@pytest.fixture(scope="module")
def reference(world):
    """The policy the checkpoint tests save, its config (max_turns 1, intermediate answers declared), its rows
    on the first 3 questions (without the side branch, which leaves them as they are)."""
    root, tokenizer = world
    cfg, params = tiny_policy(tokenizer, seed=1)
    config = make_config(root)
    config.env.max_turns = 1
    config.env.intermediate_answers = True
    env = build_env(config)
    data = datasets.load_examples(config.data.dir, "world", "test", config.data.format,
                                  config.data.tfds_dir)
    direct = harness.evaluate_policy(cfg, params, tokenizer, env, {"world": data["world"][:3]},
                                     rollout_config(config), batch_size=4, side_branch=False,
                                     placement=models.Placement.default(attention=ATTENTION))
    return cfg, params, config, direct["predictions"]


def test_cli_end_to_end_on_a_trainer_checkpoint(world, reference, tmp_path):
    root, _ = world
    cfg, params, _, want = reference
    saved_checkpoint(tmp_path / "run" / "checkpoints", cfg, params)
    config_file = tmp_path / "eval_config.py"
    config_file.write_text(textwrap.dedent(f"""
        import pathlib
        from tests.eval.test_eval import make_config

        def get_config():
            return make_config(pathlib.Path({str(root)!r}))
    """))
    out = subprocess.run([sys.executable, "-m", "searchrl.eval", f"--config={config_file}",
                          f"--checkpoint={tmp_path / 'run'}", "--datasets=world", "--limit=3",
                          "--budgets=0,1", "--config.env.max_turns=1",
                          "--config.env.intermediate_answers=True"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| dataset | n | em | f1 | cover_em | searches | format_valid |" in out.stdout
    assert "| world | 3 |" in out.stdout
    out_dir = tmp_path / "run" / "eval" / "step_3"  # under the run, beside (not inside) its checkpoints
    for name in ("results.md", "results.csv", "results.json", "predictions.jsonl", "analysis.png"):
        assert (out_dir / name).is_file(), name
    results = json.loads((out_dir / "results.json").read_text())
    assert results["meta"]["step"] == 3 and results["meta"]["max_turns"] == 1
    assert results["budgets"]["budgets"] == [0, 1] and results["depth"]["buckets"] == ["0", "1", "never"]
    got = [json.loads(line) for line in (out_dir / "predictions.jsonl").read_text().splitlines()]
    assert_same_rollouts(got, want)  # the checkpoint's params, the config's env and rollout budgets
    with checkpoint.Checkpointer(tmp_path / "run" / "checkpoints", read_only=True) as ckpt:
        assert ckpt.all_steps() == [3]


def test_evaluate_checkpoint_on_a_hugging_face_dir(reference, tmp_path):
    cfg, params, config, want = reference
    models.save_hf(cfg, params, tmp_path / "hf")
    run = run_config.parse(config)
    results, info = harness.evaluate_checkpoint(run, str(tmp_path / "hf"), datasets="world", limit=3,
                                                side_branch=False)
    assert info["kind"] == "hf" and results["depth"] is None and results["budgets"] is None
    assert_same_rollouts(results["predictions"], want)
    assert harness.default_out_dir(run, info) == Path(run.workdir) / "eval" / "hf"  # never in the model dir


def test_bad_inputs_are_named(world, tmp_path):
    root, tokenizer = world
    config = make_config(root)
    run = run_config.parse(config)
    with pytest.raises(FileNotFoundError, match="'nosuchset'"):
        harness.evaluate_checkpoint(run, str(tmp_path / "missing"), datasets="world,nosuchset")
    with pytest.raises(FileNotFoundError, match="Checkpoint not found: .*missing"):
        harness.evaluate_checkpoint(run, str(tmp_path / "missing"), datasets="world")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a Hugging Face model directory"):
        experiment.load_checkpoint(tmp_path / "empty")
    bare = run_config.base_config()
    with pytest.raises(ValueError, match="data"):
        run_config.parse(bare)
    cfg, params = tiny_policy(tokenizer)
    env = build_env(config)
    rollout = rollout_config(config)
    with pytest.raises(ValueError, match="'world' has no questions"):
        harness.evaluate_policy(cfg, params, tokenizer, env, {"world": []}, rollout, 4,
                                placement=models.Placement.default(attention=ATTENTION))
    with pytest.raises(ValueError, match="budgets must be integers >= 0"):
        harness.evaluate_policy(cfg, params, tokenizer, env, {"w": [{}]}, rollout, 4, budgets=[-1],
                                placement=models.Placement.default(attention=ATTENTION))
    with pytest.raises(ValueError, match="unknown key.*'topk_'"):
        bad = make_config(root)
        bad.env.topk_ = 3
        build_env(bad)
    with pytest.raises(ValueError, match=r"config.env.name='qa' is not a known task; known: \['autosearch'"):
        bad = make_config(root)
        bad.env.name = "qa"
        build_env(bad)
    out = subprocess.run([sys.executable, "-m", "searchrl.eval", "--config=configs/search_r1.py:tiny",
                          "--budgets=1,two"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "'two' is not a non-negative integer" in out.stderr
