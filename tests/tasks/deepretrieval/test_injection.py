"""DeepRetrieval's knowledge-injection audit end to end: the public prompt byte for byte, verdicts from a fake
chat endpoint, and the injection rate and H@1 before and after removal checked by hand on a tiny BM25 world."""
import json
import os
import textwrap

from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.tasks.deepretrieval import injection
from tests.data.retrieval_helpers import write_jsonl
from tests.eval.test_chat_api import FakeEndpoint

PASSAGES = {"d1": "William Shakespeare wrote many plays", "d2": "Paris is the capital of France",
            "d3": "The Mona Lisa hangs in the Louvre"}
QUESTIONS = {  # id: (question, gold answers, the rewrite audited, the fake auditor's answer)
    "q1": ("who wrote hamlet", ["Shakespeare"], "shakespeare",
           '<answer>{"has_answer": true, "cannot_be_derived": true, "answer_span_in_query": ["shakespeare"], '
           '"cleaned_query": ""}</answer>'),
    "q2": ("capital of france", ["Paris"], "capital france",
           '<answer>{"has_answer": false, "cannot_be_derived": false, "cleaned_query": "capital france"}</answer>'),
    "q3": ("who painted the mona lisa", ["Leonardo da Vinci"], "mona lisa painter", "I cannot tell."),
}


def public_create_prompt():
    namespace = {}
    with open(os.path.join(os.path.dirname(__file__), "public_injection_prompt.py"), encoding="utf-8") as f:
        exec(f.read(), namespace)  # the public function, verbatim
    return namespace["create_prompt"]


def test_the_prompt_is_the_public_one_byte_for_byte():
    public = public_create_prompt()
    for case in [("who wrote hamlet", "shakespeare \"hamlet\"", ["Shakespeare", "O'Neil"]), ("", "", [])]:
        assert injection.audit_prompt(*case) == public(*case)


def test_the_audit_reads_verdicts_like_the_public_code():
    assert injection.read_verdict(QUESTIONS["q1"][3], "shakespeare") == injection.Verdict(True, ("shakespeare",), "")
    assert injection.read_verdict('<answer>{"has_answer": "True", "cannot_be_derived": false}</answer>', "x") == \
        injection.Verdict(False, (), "x")
    assert injection.read_verdict("<answer>{not json</answer>", "x") == injection.Verdict(None, (), "x")


def test_audit_end_to_end_against_a_fake_chat_endpoint(tmp_path, capsys):
    data = tmp_path / "data"
    write_jsonl(data / "tinyqa" / "test.jsonl", [{"id": q, "question": text, "golden_answers": answers}
                                                 for q, (text, answers, _, _) in QUESTIONS.items()])
    write_jsonl(tmp_path / "corpus.jsonl", [{"id": d, "contents": f"{d}\n{t}"} for d, t in PASSAGES.items()])
    BM25Retriever.build(tmp_path / "corpus.jsonl", tmp_path / "bm25", show_progress=False)
    rewrites = tmp_path / "eval" / "predictions.jsonl"
    write_jsonl(rewrites, [{"dataset": "tinyqa", "id": q, "query": rewrite}
                           for q, (_, _, rewrite, _) in QUESTIONS.items()])
    config = tmp_path / "config.py"
    config.write_text(textwrap.dedent(f"""
        from searchrl import run_config

        def get_config():
            config = run_config.experiment_config("deepretrieval")
            config.env.update(dict(task="evidence", depth=20))
            config.data.update(dict(format="qa", dir={str(data)!r}, eval="tinyqa", eval_split="test"))
            config.retrieval.update(dict(kind="local", index_dir={str(tmp_path / "bm25")!r}))
            return config
    """))

    def auditor(body):
        prompt = body["messages"][-1]["content"]
        return next(reply for question, _, rewrite, reply in QUESTIONS.values()
                    if prompt == injection.audit_prompt(question, rewrite, QUESTIONS_ANSWERS[question]))

    QUESTIONS_ANSWERS = {question: answers for question, answers, _, _ in QUESTIONS.values()}
    with FakeEndpoint(auditor) as fake:
        injection.main([f"--config={config}", f"--rewrites={rewrites}", f"--api_base_url={fake.url}",
                        "--api_model=claude-3-5-sonnet", "--api_backoff=0.01"])
    assert len(fake.requests) == 3 and all(len(r[1]["messages"]) == 1 for r in fake.requests)
    results = json.loads((tmp_path / "eval" / "injection.json").read_text())
    rows = {r["id"]: r for r in results["rows"]}
    # q1's rewrite finds d1 (the answer) first; cleaned to nothing, it finds nothing. q2 is clean and finds d2;
    # q3's verdict is unreadable and its rewrite finds d3, which holds no answer.
    assert {q: (r["injected"], r["hit@1"], r["cleaned_hit@1"]) for q, r in rows.items()} == {
        "q1": (True, 1.0, 0.0), "q2": (False, 1.0, 1.0), "q3": (None, 0.0, 0.0)}
    every = results["table"][-1]
    assert (every["dataset"], every["n"], every["injection_rate"], every["unreadable"]) == ("all", 3, 0.5, 1)
    assert (every["hit@1"], every["cleaned_hit@1"]) == (2 / 3, 1 / 3)
    assert "| all | 3 | 0.500 | 1 | 0.667 | 0.333 |" in capsys.readouterr().out
