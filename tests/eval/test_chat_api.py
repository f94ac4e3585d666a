"""The OpenAI-compatible chat client against a fake endpoint served in the test (127.0.0.1, port 0): requests,
retries (Retry-After honoured), the disk cache, the usage log, rate limiting, stop strings, a prompting
baseline on it, and DeepRetrieval's API row end to end over a tiny BM25 index with a hand-checked recall."""
from __future__ import annotations

import http.server
import json
import textwrap
import threading
import time

import pytest

from searchrl.eval import chat_api
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.types import Hit
from searchrl.tasks.autosearch import baselines
from searchrl.tasks.autosearch import prompts as P
from searchrl.tasks.deepretrieval import api_rewrites
from searchrl.tasks.deepretrieval import prompts as dr_prompts
from tests.data.retrieval_helpers import write_jsonl
from tests.fakes.scripted import ScriptedServer, response, trickled

KEY = "sk-test-secret-123"


class FakeEndpoint:
    """A chat completions server: `reply(body) -> content` answers; `failures` (status, headers) are sent
    first, in order. Stops are applied as OpenAI does (the text ends before the first stop string); with
    `vllm`, the matched stop is reported as `stop_reason`. Records each request: (time, body, headers)."""

    def __init__(self, reply, failures=(), vllm=False):
        self.reply, self.failures, self.vllm = reply, list(failures), vllm
        self.requests: list[tuple[float, dict, dict]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append((time.monotonic(), body, dict(self.headers)))
                    failure = fake.failures.pop(0) if fake.failures else None
                if self.path != chat_api.ENDPOINT:
                    return self._send(404, {"error": f"no route {self.path}"})
                if failure is not None:
                    return self._send(failure[0], {"error": "busy"}, failure[1])
                self._send(200, fake.response(body))

            def _send(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def response(self, body: dict) -> dict:
        text = self.reply(body)
        ends = [(text.find(s), s) for s in body.get("stop", []) if s in text]
        choice = {"index": 0, "finish_reason": "stop"}
        if ends:
            cut, stop = min(ends)
            text = text[:cut]
            if self.vllm:
                choice["stop_reason"] = stop
        prompt_tokens = sum(len(m["content"].split()) for m in body["messages"])
        choice["message"] = {"role": "assistant", "content": text}
        return {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text.split()),
                          "total_tokens": prompt_tokens + len(text.split())}}

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def echo(body):
    return "echo: " + body["messages"][-1]["content"]


def config(fake, **kw):
    return chat_api.ChatAPIConfig(base_url=fake.url, model="m1", **{"backoff": 0.01, **kw})


def test_texts_in_order_and_the_request_sent(monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_KEY", KEY)
    with FakeEndpoint(echo) as fake:
        cfg = config(fake, key_env="FAKE_KEY", temperature=0.3, max_tokens=64, concurrency=3,
                     usage_log=str(tmp_path / "usage.jsonl"))
        generate = chat_api.ChatGenerate(chat_api.ChatClient(cfg))
        prompts = [f"question {i}" for i in range(7)] + [[{"role": "system", "content": "sys"},
                                                          {"role": "user", "content": "hi"}]]
        texts = generate(prompts, ("\n",))
    assert texts == [f"echo: question {i}" for i in range(7)] + ["echo: hi"]
    bodies = sorted((body for _, body, _ in fake.requests), key=lambda b: b["messages"][-1]["content"])
    assert bodies[-1] == {"model": "m1", "messages": [{"role": "user", "content": "question 6"}],
                          "temperature": 0.3, "max_tokens": 64, "stop": ["\n"]}
    assert bodies[0]["messages"] == prompts[-1]
    assert {headers["Authorization"] for _, _, headers in fake.requests} == {f"Bearer {KEY}"}
    assert KEY not in (tmp_path / "usage.jsonl").read_text()


def test_429_then_success_honours_retry_after():
    slept = []
    with FakeEndpoint(echo, failures=[(429, {"Retry-After": "2"}), (503, {})]) as fake:
        client = chat_api.ChatClient(config(fake, backoff=0.5), sleep=slept.append)
        assert chat_api.ChatGenerate(client)(["a"]) == ["echo: a"]
    assert slept == [2.0, 1.0]  # Retry-After's 2 s, then the backoff doubled for the second retry
    assert len(fake.requests) == 3 and client.requests_made == 3


def test_client_errors_are_not_retried_and_retries_run_out():
    slept = []
    with FakeEndpoint(echo, failures=[(400, {})]) as fake:
        with pytest.raises(chat_api.ChatAPIError, match="HTTP 400.*busy"):
            chat_api.ChatClient(config(fake), sleep=slept.append).complete([{"role": "user", "content": "a"}])
    assert len(fake.requests) == 1 and slept == []
    with FakeEndpoint(echo) as fake:
        closed = fake.url
    client = chat_api.ChatClient(chat_api.ChatAPIConfig(closed, "m1", max_retries=2, backoff=0.25),
                                 sleep=slept.append)
    with pytest.raises(chat_api.ChatAPIError, match="ConnectionRefusedError.*after 3 attempts"):
        client.complete([{"role": "user", "content": "a"}])
    assert slept == [0.25, 0.5]


def test_cache_hit_makes_no_request(tmp_path):
    with FakeEndpoint(echo) as fake:
        cfg = config(fake, cache_dir=str(tmp_path / "cache"))
        first = chat_api.ChatGenerate(chat_api.ChatClient(cfg))(["a", "b", "c"], ("\n",))
        assert len(fake.requests) == 3
        again = chat_api.ChatClient(cfg)  # a rerun: a new client, the same cache
        assert chat_api.ChatGenerate(again)(["a", "b", "c"], ("\n",)) == first
        assert len(fake.requests) == 3 and again.requests_made == 0
        chat_api.ChatGenerate(chat_api.ChatClient(config(fake, cache_dir=str(tmp_path / "cache"),
                                                         temperature=0.7)))(["a"], ("\n",))
        chat_api.ChatGenerate(again)(["a"], ())  # other stops: another request
    assert len(fake.requests) == 5


def test_usage_log_and_costs_from_the_users_prices(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"m1": {"prompt": 2.5, "completion": 10.0}}))
    log = tmp_path / "usage.jsonl"
    with FakeEndpoint(lambda body: "one two three four") as fake:
        for model in ("m1", "m2"):
            cfg = chat_api.ChatAPIConfig(fake.url, model, usage_log=str(log), prices=str(prices))
            chat_api.ChatClient(cfg).complete([{"role": "user", "content": "five words in this prompt"}])
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["model"], r["prompt_tokens"], r["completion_tokens"], r["attempts"]) for r in rows] == [
        ("m1", 5, 4, 1), ("m2", 5, 4, 1)]
    assert rows[0]["cost_usd"] == pytest.approx((5 * 2.5 + 4 * 10.0) / 1e6)
    assert rows[1]["cost_usd"] is None  # no price given for m2: no cost made up
    summary = chat_api.usage_summary(log)
    assert summary["m1"] == {"requests": 1, "prompt_tokens": 5, "completion_tokens": 4,
                             "cost_usd": pytest.approx(5.25e-5)}
    assert summary["m2"]["cost_usd"] is None
    prices.write_text(json.dumps({"m1": {"input": 1.0}}))
    with pytest.raises(ValueError, match="m1.*'prompt'"):
        chat_api.load_prices(str(prices))


def test_rate_limit_spaces_request_starts():
    with FakeEndpoint(echo) as fake:
        cfg = config(fake, requests_per_second=10.0, concurrency=4)
        chat_api.ChatGenerate(chat_api.ChatClient(cfg))([str(i) for i in range(6)])
    times = sorted(t for t, _, _ in fake.requests)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) > 0.05, gaps  # 0.1 s apart, with a generous margin for scheduling
    assert times[-1] - times[0] > 0.4


def test_stop_strings_kept_as_the_rollout_engine_keeps_them():
    reply = "Let me search. " + P.BEGIN_QUERY + "capital of France" + P.END_QUERY + " and more"
    with FakeEndpoint(lambda body: reply, vllm=True) as fake:  # the server names the stop it matched
        text, = chat_api.ChatGenerate(chat_api.ChatClient(config(fake)))(["q"], (P.END_QUERY,))
    with FakeEndpoint(lambda body: reply) as fake:  # it does not: stops applied here
        client = chat_api.ChatClient(config(fake, server_stop=False))
        assert chat_api.ChatGenerate(client)(["q"], ("\n", P.END_QUERY)) == [text]
        assert "stop" not in fake.requests[0][1]
    assert text == reply[:-len(" and more")] and P.search_o1_query(text) == "capital of France"


def test_server_extensions_continue_a_final_assistant_message():
    with FakeEndpoint(echo) as fake:
        client = chat_api.ChatClient(config(fake, server_extensions=True))
        prompt = P.continued(P.template("", "question", True), "so far")
        chat_api.ChatGenerate(client)([prompt], ())
    body = fake.requests[0][1]
    assert body["messages"][-1] == {"role": "assistant", "content": "so far"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_config_errors_name_the_field(monkeypatch):
    with pytest.raises(ValueError, match="ends with /v1"):
        chat_api.ChatAPIConfig("https://api.example.com/v1", "m")
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_KEY"):
        chat_api.ChatAPIConfig("https://api.example.com", "m", key_env="NO_SUCH_KEY")


def chat_reply(content, usage=None) -> bytes:
    """A raw 200 answering with `content` (and `usage`, default 3 + 1 tokens)."""
    body = {"choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": usage if usage is not None else {"prompt_tokens": 3, "completion_tokens": 1}}
    return response("200 OK", json.dumps(body).encode(), "Content-Type: application/json")


def ask(client: chat_api.ChatClient) -> str:
    return client.complete([{"role": "user", "content": "a"}]).text


@pytest.fixture
def scripted():
    servers = []

    def make(*replies):
        servers.append(ScriptedServer(*replies))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


@pytest.mark.parametrize("header, seconds", [
    ("2", 2.0), ("-5", 0.0), ("99999999", 60.0), ("1e400", 60.0), ("Fri, 31 Dec 9999 23:59:59 GMT", 60.0),
    ("nan", None), ("soon", None), (None, None)])
def test_retry_after_is_capped(header, seconds):
    assert chat_api.retry_after(header, time.time(), 60.0) == seconds


def test_a_hostile_retry_after_waits_at_most_max_backoff():
    """Issue 67 cause 9: a Retry-After of 99,999,999 s slept that long; 1e400 and a year-9999 date raised
    OverflowError."""
    slept = []
    failures = [(429, {"Retry-After": "99999999"}), (503, {"Retry-After": "1e400"}),
                (429, {"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"})]
    with FakeEndpoint(echo, failures=failures) as fake:
        client = chat_api.ChatClient(config(fake, max_backoff=5.0), sleep=slept.append)
        assert chat_api.ChatGenerate(client)(["a"]) == ["echo: a"]
    assert slept == [5.0, 5.0, 5.0]


def test_a_trickled_answer_times_out_as_a_whole(scripted):
    """Issue 67 cause 9: `timeout` bounded each socket read, so a body trickled a byte every 2 s never timed
    out. Scaled: a byte every 0.2 s, each read well within the 0.8 s timeout, the whole answer not."""
    server = scripted(trickled(chat_reply("hello"), 0.2))
    client = chat_api.ChatClient(chat_api.ChatAPIConfig(server.url, "m1", timeout=0.8, max_retries=1,
                                                        backoff=0.01))
    start = time.monotonic()
    with pytest.raises(chat_api.ChatAPIError, match=r"TimeoutError: .*after 2 attempts"):
        ask(client)
    assert 1.5 < time.monotonic() - start < 3.0 and server.connections == 2


def test_a_200_that_is_not_json_is_retried_and_then_a_chat_api_error(scripted):
    """Issue 67 cause 9: a 200 with a non-JSON body raised a raw JSONDecodeError, not retried."""
    html = response("200 OK", b"<html>maintenance</html>")
    server = scripted(html, chat_reply("fine"))
    assert ask(chat_api.ChatClient(chat_api.ChatAPIConfig(server.url, "m1", backoff=0.01))) == "fine"
    assert server.connections == 2
    server = scripted(html)
    client = chat_api.ChatClient(chat_api.ChatAPIConfig(server.url, "m1", max_retries=2, backoff=0.01))
    with pytest.raises(chat_api.ChatAPIError, match=r"HTTP 200 with a body that is not JSON .*<html>"
                                                    r".*after 3 attempts"):
        ask(client)


def test_list_content_is_its_text_parts_joined(scripted, tmp_path):
    """Issue 67 cause 9: a list-valued content was returned and cached as the text."""
    parts = [{"type": "text", "text": "Hel"}, "lo"]
    server = scripted(chat_reply(parts), chat_reply([{"type": "image_url", "image_url": {"url": "x"}}]))
    client = chat_api.ChatClient(chat_api.ChatAPIConfig(server.url, "m1", cache_dir=str(tmp_path)))
    assert ask(client) == "Hello"
    cached, = tmp_path.glob("*/*.json")
    assert json.loads(cached.read_text())["completion"]["text"] == "Hello"
    with pytest.raises(chat_api.ChatAPIError, match="content part 0 is not text \\(type 'image_url'\\)"):
        client.complete([{"role": "user", "content": "b"}])
    assert chat_api.message_text(None) == ""
    with pytest.raises(ValueError, match="content must be a string or a list of parts, got int"):
        chat_api.message_text(7)


def test_accounting_never_loses_a_paid_answer(scripted, tmp_path):
    """Issue 67 cause 9: null token counts or prices given as strings raised TypeError after the request
    was paid and before it was cached, so every rerun paid again. Prices are checked before any request;
    an answer is cached before it is accounted; counts the server does not give are logged as None."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"m1": {"prompt": "2.5", "completion": 10}}))
    server = scripted(chat_reply("paid", usage={"prompt_tokens": None, "completion_tokens": "7"}))
    cfg = chat_api.ChatAPIConfig(server.url, "m1", cache_dir=str(tmp_path / "cache"), prices=str(prices),
                                 usage_log=str(tmp_path / "usage.jsonl"))
    with pytest.raises(ValueError, match=rf"{prices}: model 'm1' 'prompt' price must be a number >= 0 .*"
                                         r"got '2.5'"):
        chat_api.ChatClient(cfg)
    assert server.connections == 0
    prices.write_text(json.dumps({"m1": {"prompt": 2.5, "completion": 10}}))
    assert ask(chat_api.ChatClient(cfg)) == "paid"
    again = chat_api.ChatClient(cfg)
    assert ask(again) == "paid" and again.requests_made == 0 and server.connections == 1
    row, = [json.loads(line) for line in (tmp_path / "usage.jsonl").read_text().splitlines()]
    assert (row["prompt_tokens"], row["completion_tokens"], row["cost_usd"]) == (None, None, None)
    assert chat_api.usage_summary(tmp_path / "usage.jsonl")["m1"] == {
        "requests": 1, "prompt_tokens": None, "completion_tokens": None, "cost_usd": None}


def test_an_answer_that_cannot_be_recorded_is_a_chat_api_error(scripted, tmp_path):
    (tmp_path / "cache").write_text("")  # a file where the cache folder should be
    server = scripted(chat_reply("x"))
    client = chat_api.ChatClient(chat_api.ChatAPIConfig(server.url, "m1", cache_dir=str(tmp_path / "cache")))
    with pytest.raises(chat_api.ChatAPIError, match=r"cannot record the answer of http://\S+ "
                                                    r"\((FileExistsError|NotADirectoryError): "):
        ask(client)


def test_a_torn_cache_entry_names_its_file(scripted, tmp_path):
    """Issue 67 cause 9: a torn cache entry raised a JSONDecodeError naming no file."""
    server = scripted(chat_reply("kept"))
    cfg = chat_api.ChatAPIConfig(server.url, "m1", cache_dir=str(tmp_path))
    assert ask(chat_api.ChatClient(cfg)) == "kept"
    entry, = tmp_path.glob("*/*.json")
    entry.write_text(entry.read_text()[:25])
    with pytest.raises(chat_api.ChatAPIError, match=rf"{entry}: a torn cache entry \(JSONDecodeError: .*\); "
                                                    "delete it to request the answer again"):
        ask(chat_api.ChatClient(cfg))
    assert server.connections == 1


class OnePassage:
    """One passage for any query; remembers the queries."""

    def __init__(self):
        self.calls = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [[Hit("d1", 1.0, "Paris", "Paris is the capital of France.")] for _ in queries]


def search_o1_reply(body):
    """A scripted reasoner: searches once, reads the documents, then answers."""
    last = body["messages"][-1]
    if last["role"] == "assistant" and P.END_RESULT in last["content"]:
        return "So the answer is \\boxed{Paris}."
    if body.get("stop") == [P.END_QUERY]:
        return f"I need to search. {P.BEGIN_QUERY}capital of France{P.END_QUERY} then guess"
    return "The pages say so.\n**Final Information**\nParis is the capital of France."


def test_search_o1_baseline_runs_on_the_endpoint():
    retriever = OnePassage()
    with FakeEndpoint(search_o1_reply, vllm=True) as fake:
        generate = chat_api.ChatGenerate(chat_api.ChatClient(config(fake)))
        results = baselines.evaluate_baselines(
            generate, retriever, {"nq": [{"id": "q0", "question": "What is the capital of France?",
                                          "golden_answers": ["Paris"]}]}, ["search_o1"],
            baselines.Options(topk=1, chat=True))
    row, = results["search_o1"]["predictions"]
    assert (row["answer"], row["em"], row["searches"]) == ("Paris", 1.0, 1)
    assert retriever.calls == [["capital of France"]] and len(fake.requests) == 3
    assert "Paris is the capital of France." in fake.requests[2][1]["messages"][-1]["content"]


# DeepRetrieval's API row: 4 passages, 2 BEIR queries whose raw words match nothing in the corpus.
CORPUS = {"d1": "volcano eruption buried pompeii", "d2": "penicillin mould antibiotic",
          "d3": "bees waggle dance flowers", "d4": "titanic iceberg sank"}
QUERIES = {"q0": ("which ancient cities did the mountain explosion destroy", ["d1"]),
           "q1": ("how do insects talk about food", ["d3", "d4"])}
REWRITES = {  # the API's answers: q0 in an <answer> block, q1 without one (the public fallback)
    "q0": '<think>\nvolcanoes\n</think>\n<answer>\n{"query": "volcano eruption pompeii"}\n</answer>',
    "q1": 'I would search {"query": "bees dance"} for this.'}


def rewrite_reply(body):
    user = body["messages"][-1]["content"]
    return next(REWRITES[qid] for qid, (question, _) in QUERIES.items() if question in user)


@pytest.fixture
def beir_world(tmp_path):
    data = tmp_path / "data" / "tinybeir"
    write_jsonl(data / "corpus.jsonl", [{"_id": d, "title": "", "text": t} for d, t in CORPUS.items()])
    write_jsonl(data / "queries.jsonl", [{"_id": q, "text": text} for q, (text, _) in QUERIES.items()])
    (data / "qrels").mkdir()
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, (_, docs) in QUERIES.items() for d in docs))
    BM25Retriever.build(data / "corpus.jsonl", tmp_path / "bm25", show_progress=False)
    config_file = tmp_path / "api_config.py"
    config_file.write_text(textwrap.dedent(f"""
        from searchrl import run_config

        def get_config():
            config = run_config.experiment_config("deepretrieval")
            config.workdir = {str(tmp_path / "run")!r}
            config.env.update(dict(task="classic", depth=10))
            config.data.update(dict(format="beir", dir={str(tmp_path / "data")!r}, eval="tinybeir",
                                    eval_split="test"))
            config.retrieval.update(dict(kind="local", index_dir={str(tmp_path / "bm25")!r}))
            return config
    """))
    return config_file


def test_deepretrieval_api_row_end_to_end(beir_world, tmp_path, capsys):
    def run(out):
        api_rewrites.main([f"--config={beir_world}", f"--api_base_url={fake.url}", "--api_model=gpt-4o",
                           f"--api_cache_dir={tmp_path / 'cache'}", f"--api_usage_log={tmp_path / 'u.jsonl'}",
                           f"--out={tmp_path / out}"])
        return capsys.readouterr().out

    with FakeEndpoint(rewrite_reply) as fake:
        assert "2 requests made" in run("out")
        assert "0 requests made" in run("rerun") and len(fake.requests) == 2  # served by the cache
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "predictions.jsonl").read_text()
                                    .splitlines())}
    # q0's rewrite retrieves d1, its one relevant passage; q1's retrieves d3, one of its two.
    got = {q: (r["query"], r["answer_block"], r["recall@10"], r["raw_recall@10"]) for q, r in rows.items()}
    assert got == {"q0": ("volcano eruption pompeii", 1.0, 1.0, 0.0), "q1": ("bees dance", 0.0, 0.5, 0.0)}
    for out in ("out", "rerun"):
        results = json.loads((tmp_path / out / "results.json").read_text())
        average = results["table"][-1]
        assert (average["dataset"], average["recall@10"], average["raw_recall@10"]) == ("average", 0.75, 0.0)
    assert {r["metric"]: r["gain"] for r in results["raw_vs_rewritten"] if r["dataset"] == "average"
            }["recall@10"] == 0.75
    # The public prompt: the user turn and the assistant's first words, one user message.
    sent = fake.requests[0][1]["messages"]
    assert len(sent) == 1 and sent[0]["role"] == "user"
    assert sent[0]["content"].endswith("\nAssistant: " + dr_prompts.PROMPTS["classic", True].assistant)
    assert len((tmp_path / "u.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("text, value", [
    ('<answer>\n{"query": "a OR b"}\n</answer>', ("a OR b", True)),
    ("<answer>plain words</answer>", ("plain words", True)),
    ('<answer>{"other": 1}</answer>', ('{"other": 1}', True)),
    ('no block "query": "x y" here', ("x y", False)),
    ("just words", ("just words", False)),
])
def test_api_value_follows_the_public_post_processing(text, value):
    assert api_rewrites.api_value(text, "query") == value
