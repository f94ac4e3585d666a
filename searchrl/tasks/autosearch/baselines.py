"""Prompting baselines on any checkpoint, no training: Direct, CoT, RAG, IRCoT and Search-o1, with the
config's retriever and the search-QA metrics (EM / F1 / cover-EM of `searchrl.text.qa`), so that the
papers' baseline rows come from the same retriever, top-k and metrics as the trained policies.

Every method is its public code's loop (prompts and parsers in `searchrl.tasks.autosearch.prompts`, cited there) over one
primitive, `Generate`: batched greedy generation until a stop string, run by the rollout engine (`Generator`).
- direct    [FR] zero-shot prompt; the answer is the first line.
- cot       [SO1] its direct-generation prompt (think step by step, answer in \\boxed{}); the last boxed
            answer.
- rag       [FR] one retrieval with the question, the top-k passages in the default template; the first line.
- ircot     [FR] IRCOTPipeline: a retrieval with the question, then per step one thought (up to "." or a
            newline) and, until a thought gives "So the answer is:", a retrieval with that thought; passages
            pooled at their best score in ascending order (as FlashRAG sorts them); at most `ircot_max_iter`
            thoughts.
- search_o1 [SO1] run_search_o1.py: reasoning that searches with <|begin_search_query|> ...
            <|end_search_query|>; each search's passages go through Reason-in-Documents (a second generation),
            whose "Final Information" joins the reasoning; limits on searches (5 single-hop, 10 multi-hop),
            repeated queries and turns (15); the last boxed answer.
Deviations from the public runs: greedy decoding (the harness's), local passages in place of web pages,
prompts beyond `rollout.max_prompt_tokens` cut in the middle (FlashRAG's `truncate_prompt`, special tokens
kept), and IRCoT makes no retrieval after its last thought (FlashRAG's is never read).

An example a task scores its own way (`searchrl.task.answer_scorer`) is scored so: a GlobalQA example
(metadata "type" one of RPL's GLOBALQA_TYPES) as the RPL env scores it (`globalqa_scores`): answer F1 of the
document ids the answer cites, a number naming the document the prompt showed under it ("Doc 2"), and dF1 of
the documents shown (Search-o1's passages are read by Reason-in-Documents only, so its answer can cite them
by id alone). Other examples get
EM, F1 and cover-EM. `--thinking` / `--nothinking` render chat prompts with Qwen3's `enable_thinking`
(default: the template's own); it needs `--chat` (or an endpoint), and a checkpoint whose chat template
ignores the switch is an error rather than a run that silently thinks as before.

    python -m searchrl.tasks.autosearch.baselines --config configs/search_r1.py:paper --checkpoint CKPT \\
        [--methods direct,cot,rag,ircot,search_o1] [--chat] [--datasets nq,hotpotqa] [--split test] [--limit N]
        [--step N] [--batch_size B] [--out DIR] [--thinking|--nothinking] [--config.x.y=value ...]

With --api_model and --api_base_url (and the other --api_* flags of `searchrl.eval.chat_api`), an
OpenAI-compatible chat endpoint generates instead of a checkpoint (API models, a local vLLM / SGLang server);
prompts are then chat messages (the endpoint renders its model's template; IRCoT's text prompt is one user
message).

Writes baselines.md, baselines.json and a report per method to --out (default: the checkpoint's evaluation
directory, plus /baselines; for an endpoint, <config.workdir>/eval/api_<model>/baselines). A checkpoint
generates on the config's mesh and, with --config.distributed.*, as one process of a multi-process run: each
process generates its rows of every batch (`Generator`), the methods' loops and retrievals run on every
process with all the texts, and process 0 writes.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
from absl import flags

from searchrl import cli, distributed, experiment, models, run_config, task
from searchrl.episode import Action, Env
from searchrl.eval import chat_api, harness, report, selection
from searchrl.retrieval import make_retriever
from searchrl.retrieval.types import Hit, Retriever
from searchrl.rollout.config import RolloutConfig, SamplingParams
from searchrl.run_config import RunConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.tasks.autosearch import prompts as P
from searchrl.tasks.search_r1.env import ANSWER
from searchrl.text import chat, qa

# (prompts, stop strings; () = EOS only) -> the generated texts
Generate = Callable[[Sequence[chat.Prompt], tuple[str, ...]], list[str]]


@dataclasses.dataclass(frozen=True)
class Options:
    """Settings shared by the methods."""

    topk: int = 3  # passages per retrieval (the CLI passes config.env.topk: the trained policies' k)
    chat: bool = False  # prompt through the tokenizer's chat template (instruct models); IRCoT's stays text
    ircot_max_iter: int = 2  # [FR] docs/original_docs/baseline_details.md: "Max iter is set to 2"
    search_o1_max_turns: int = P.SEARCH_O1_MAX_TURNS
    thinking: bool | None = None  # chat prompts: the template's enable_thinking (None: its default)


@dataclasses.dataclass
class Output:
    """One question's result: the parsed answer, everything generated, and the retrievals made."""

    answer: str
    response: str
    searches: int
    shown: tuple[tuple[str, str], ...] = ()  # (name, id) of each document shown, as the prompts named it


# ---- Generation on the rollout engine ----

@dataclasses.dataclass(frozen=True)
class PromptEnv(Env):
    """One policy turn per example, from its ready prompt (`example["prompt"]`) until a stop string or EOS:
    the rollout engine as a text generator (every episode ends after one turn, so nothing is observed)."""

    stop_strings: tuple[str, ...]
    side_branch = None

    def prompt(self, example: Mapping[str, Any]) -> str:
        return example["prompt"]

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        return Action(ANSWER, turn_text, done=True)


def fit_prompt(tokenizer: Any, text: str, max_tokens: int) -> str:
    """[FR] `PromptTemplate.truncate_prompt`: a prompt of `max_tokens` tokens or more keeps its first and last
    (max_tokens / 2 - 20) tokens."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < max_tokens:
        return text
    half = max(max_tokens // 2 - 20, 1)
    return tokenizer.decode(ids[:half]) + tokenizer.decode(ids[-half:])


class Generator:
    """`Generate` with the rollout engine: greedy, prompts rendered (`chat.render`) and fitted to
    `rollout.max_prompt_tokens`, in batches of exactly `batch_size`; one engine per set of stop strings.
    On the `placement`'s mesh (if any), across its processes as the evaluation harness rolls out
    (`harness.rollout_rows`: each process its rows of every batch, every process gets all texts); batch_size
    is then rounded up to a multiple of its data-parallel size."""

    def __init__(self, model_cfg: models.ModelConfig, params, tokenizer: Any, rollout: RolloutConfig,
                 batch_size: int, placement: models.Placement):
        self.model_cfg, self.tokenizer, self.placement = model_cfg, tokenizer, placement
        self.mesh = placement.mesh
        self.batch_size = harness.mesh_batch_size(batch_size, self.mesh)
        self.params = harness.placed_params(model_cfg, params, self.mesh, placement.sample.rules)
        self.rollout = dataclasses.replace(
            rollout, max_len=rollout.max_prompt_tokens + rollout.max_turn_tokens,
            sampling=SamplingParams(temperature=0.0))
        self.engines: dict[tuple[str, ...], RolloutEngine] = {}

    def engine(self, stops: tuple[str, ...]) -> RolloutEngine:
        stops = stops or (self.tokenizer.eos_token,)
        if stops not in self.engines:
            env = PromptEnv(stops)
            self.engines[stops] = RolloutEngine(self.model_cfg, self.tokenizer, env, self.rollout,
                                                placement=self.placement)
        return self.engines[stops]

    def __call__(self, prompts: Sequence[chat.Prompt], stops: tuple[str, ...] = ()) -> list[str]:
        examples = [{"prompt": fit_prompt(self.tokenizer, chat.render(self.tokenizer, p),
                                          self.rollout.max_prompt_tokens)} for p in prompts]
        return harness.rollout_rows(self.engine(stops), self.params, examples, self.batch_size,
                                    lambda traj, _: [turns[0].text for turns in traj.turns], self.mesh,
                                    desc="generate")


# ---- The methods ----

def strip_stop(text: str, stops: Sequence[str]) -> str:
    """`text` without the stop string it ends with (vLLM leaves stop strings out of its outputs)."""
    for stop in stops:
        if text.endswith(stop):
            return text[:-len(stop)]
    return text


def questions(examples: Sequence[Mapping[str, Any]]) -> list[str]:
    return [example["question"] for example in examples]


def direct(examples: Sequence[Mapping[str, Any]], generate: Generate, retriever: Retriever, options: Options
           ) -> list[Output]:
    prompts = [P.template(P.DIRECT_SYSTEM, P.QUESTION_USER.format(question=q), options.chat)
               for q in questions(examples)]
    return [Output(P.first_line(text), text, 0) for text in generate(prompts, ("\n",))]


def cot(examples: Sequence[Mapping[str, Any]], generate: Generate, retriever: Retriever, options: Options
        ) -> list[Output]:
    prompts = [P.template("", P.COT_USER.format(question=q), options.chat) for q in questions(examples)]
    return [Output(P.boxed_answer(text), text, 0) for text in generate(prompts, ())]


def rag(examples: Sequence[Mapping[str, Any]], generate: Generate, retriever: Retriever, options: Options
        ) -> list[Output]:
    qs = questions(examples)
    found = retriever.search(qs, options.topk)
    prompts = [P.rag_prompt(q, hits, options.chat) for q, hits in zip(qs, found)]
    return [Output(P.first_line(text), text, 1, numbered(hits))
            for text, hits in zip(generate(prompts, ("\n",)), found)]


def numbered(hits: Sequence[Hit]) -> tuple[tuple[str, str], ...]:
    """(name, id) of passages as `format_passages` shows them: "Doc 1", "Doc 2", ..."""
    return tuple((str(i + 1), hit.id) for i, hit in enumerate(hits))


def pooled(passages: Sequence[Hit], hits: Sequence[Hit]) -> list[Hit]:
    """[FR] IRCoT's passages: every passage retrieved so far at its best score, sorted by ascending score."""
    best = {hit.id: hit for hit in passages}
    for hit in hits:
        if hit.id not in best or hit.score > best[hit.id].score:
            best[hit.id] = hit
    return sorted(best.values(), key=lambda hit: hit.score)


def ircot(examples: Sequence[Mapping[str, Any]], generate: Generate, retriever: Retriever, options: Options
          ) -> list[Output]:
    qs = questions(examples)
    passages = retriever.search(qs, options.topk)
    thoughts: list[list[str]] = [[] for _ in qs]
    searches = [1] * len(qs)
    active = list(range(len(qs)))
    for step in range(options.ircot_max_iter):
        texts = generate([P.ircot_prompt(qs[i], passages[i], thoughts[i]) for i in active], P.IRCOT_STOPS)
        for i, text in zip(active, texts):
            thoughts[i].append(strip_stop(text, P.IRCOT_STOPS))
        active = [i for i in active if P.IRCOT_ANSWER not in thoughts[i][-1]]
        if not active or step == options.ircot_max_iter - 1:
            break
        for i, hits in zip(active, retriever.search([thoughts[i][-1] for i in active], options.topk)):
            passages[i] = pooled(passages[i], hits)
            searches[i] += 1
    # the pooled passages: every one shown, named as the last prompt numbered them
    return [Output(P.ircot_answer(" ".join(t)), " ".join(t), n, numbered(p))
            for t, n, p in zip(thoughts, searches, passages)]


@dataclasses.dataclass
class Reasoning:
    """One question's Search-o1 state: its prompt, what was generated and appended so far, its searches."""

    prompt: chat.Prompt
    max_searches: int
    output: str = ""
    queries: set[str] = dataclasses.field(default_factory=set)
    finished: bool = False
    shown: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def search_o1_turn(rows: Sequence[Reasoning], texts: Sequence[str]) -> list[tuple[Reasoning, str]]:
    """[SO1] Appends each row's generation; a row that wrote no query is finished, a query over the limit or
    already searched gets Search-o1's message. Returns the (row, query) pairs to search."""
    to_search = []
    for row, text in zip(rows, texts):
        row.output += text
        query = P.search_o1_query(text)
        if query is None:
            row.finished = True
        elif len(row.queries) >= row.max_searches:
            row.output += P.LIMIT_MESSAGE
        elif query in row.queries:
            row.output += P.REPEAT_MESSAGE
        else:
            row.queries.add(query)
            to_search.append((row, query))
    return to_search


def search_o1(examples: Sequence[Mapping[str, Any]], generate: Generate, retriever: Retriever,
              options: Options) -> list[Output]:
    rows = [Reasoning(P.search_o1_prompt(ex["question"], ex["dataset"], options.chat),
                      P.search_o1_max_searches(ex["dataset"])) for ex in examples]
    for _ in range(options.search_o1_max_turns):
        active = [row for row in rows if not row.finished]
        if not active:
            break
        texts = generate([P.continued(row.prompt, row.output) for row in active], (P.END_QUERY,))
        to_search = search_o1_turn(active, texts)
        if not to_search:
            continue
        found = retriever.search([query for _, query in to_search], options.topk)
        requests = [P.reason_in_documents_prompt(row.output, query, hits, options.chat)
                    for (row, query), hits in zip(to_search, found)]
        for (row, _), text, hits in zip(to_search, generate(requests, ()), found):
            row.output += P.search_result(P.final_information(text))
            row.shown += [(hit.id, hit.id) for hit in hits]  # the answer never sees their numbers
    return [Output(P.boxed_answer(row.output), row.output, len(row.queries), tuple(row.shown))
            for row in rows]


METHODS: dict[str, Callable[..., list[Output]]] = {
    "direct": direct, "cot": cot, "rag": rag, "ircot": ircot, "search_o1": search_o1}


# ---- Evaluation ----

def answer_metrics(example: Mapping[str, Any], output: Output) -> dict[str, Any]:
    """The row of one answer: EM, F1 and cover-EM against the golden answers (a GlobalQA example: RPL's answer
    F1 and dF1), and the searches."""
    golds = list(example["golden_answers"])
    scorer = task.answer_scorer(example)
    scores = scorer.score(output.answer, output.shown, example) if scorer else qa.scores(output.answer, golds)
    return {"question": example["question"], "golden_answers": golds, "answer": output.answer,
            **scores, "searches": output.searches, "response": output.response}


def with_thinking(generate: Generate, thinking: bool | None) -> Generate:
    """`generate` with every chat prompt rendered at `enable_thinking=thinking` (unchanged when None)."""
    if thinking is None:
        return generate

    def switched(prompts: Sequence[chat.Prompt], stops: tuple[str, ...]) -> list[str]:
        return generate([p if isinstance(p, str) else
                         chat.Chat(tuple(p.messages if isinstance(p, chat.Chat) else p),
                                   {**getattr(p, "template_kwargs", {}), "enable_thinking": thinking})
                         for p in prompts], stops)
    return switched


def check_thinking(tokenizer: Any, options: Options) -> None:
    """A thinking switch needs chat prompts and a chat template that reads `enable_thinking`."""
    if options.thinking is None:
        return
    if not options.chat:
        raise ValueError("--thinking / --nothinking switch the chat template: add --chat.")
    probe = chat.messages("", "?")
    on, off = (chat.render(tokenizer, chat.Chat(tuple(probe), {"enable_thinking": t})) for t in (True, False))
    if on == off:
        raise ValueError("--thinking / --nothinking: the tokenizer's chat template ignores enable_thinking "
                         "(a Qwen3 template reads it); leave the flag out for this model.")


def check_methods(methods: Sequence[str]) -> None:
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"Unknown baseline(s) {unknown or list(methods)}; known: {list(METHODS)}")


def evaluate_baselines(generate: Generate, retriever: Retriever, datasets: Mapping[str, Sequence[dict]],
                       methods: Sequence[str] = tuple(METHODS), options: Options = Options()
                       ) -> dict[str, dict[str, Any]]:
    """Per method: `report.aggregate`'s summaries of its question rows, plus "meta" and "predictions"."""
    check_methods(methods)
    examples = harness.tagged_examples(datasets)
    generate = with_thinking(generate, options.thinking)
    results = {}
    for method in methods:
        outputs = METHODS[method](examples, generate, retriever, options)
        rows = [harness.question_row(ex, answer_metrics(ex, out)) for ex, out in zip(examples, outputs)]
        meta = {"method": method, "datasets": ",".join(datasets), "questions": len(rows),
                **dataclasses.asdict(options), "decoding": "greedy"}
        results[method] = {"meta": meta, **report.aggregate(rows), "predictions": rows}
    return results


def evaluate_baselines_checkpoint(config: RunConfig, checkpoint: str = "", *,
                                  step: int | None = None, methods: Sequence[str] = tuple(METHODS),
                                  datasets: str = "", split: str = "", limit: int | None = None,
                                  batch_size: int = 0, use_chat: bool = False, thinking: bool | None = None
                                  ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The baselines of a checkpoint (as `harness.evaluate_checkpoint` takes it) with the retriever, top-k
    (config.env.topk), rollout budgets and mesh of `config`; returns (results by method, the policy's
    source)."""
    check_methods(methods)
    data, split = harness.load_eval_data(config, datasets, split, limit)
    built = experiment.build(config, train_data=False, checkpoint=checkpoint, step=step)
    retriever = getattr(built.env, "retriever", None) or make_retriever(config.retrieval)
    generate = Generator(built.model_cfg, built.policy, built.tokenizer, built.rollout,
                         batch_size or config.train.batch_size, models.placement_of(config.mesh))
    options = Options(topk=getattr(config.env, "topk", Options.topk), chat=use_chat, thinking=thinking)
    check_thinking(built.tokenizer, options)
    results = evaluate_baselines(generate, retriever, data, methods, options)
    for result in results.values():
        result["meta"] = {**built.source, "split": split, **result["meta"]}
    return results, built.source


def evaluate_baselines_api(config: RunConfig, api: chat_api.ChatAPIConfig, *,
                           methods: Sequence[str] = tuple(METHODS), datasets: str = "", split: str = "",
                           limit: int | None = None, thinking: bool | None = None
                           ) -> dict[str, dict[str, Any]]:
    """The baselines with a chat endpoint generating (chat prompts; `thinking` goes as chat_template_kwargs),
    the retriever and top-k of `config`."""
    check_methods(methods)
    data, split = harness.load_eval_data(config, datasets, split, limit)
    generate = chat_api.ChatGenerate(chat_api.ChatClient(api))
    options = Options(topk=getattr(config.env, "topk", Options.topk), chat=True, thinking=thinking)
    results = evaluate_baselines(generate, make_retriever(config.retrieval), data, methods, options)
    for result in results.values():
        result["meta"] = {"kind": "api", "model": api.model, "base_url": api.base_url, "split": split,
                          **result["meta"], "decoding": f"temperature {api.temperature}"}
    return results


def baseline_rows(results: Mapping[str, Mapping[str, Any]], metric: str) -> tuple[list[str], list[tuple]]:
    """(header, rows) of the papers' baseline table: per method, `metric` on each dataset and the average."""
    groups = [row["dataset"] for row in next(iter(results.values()))["table"]]
    rows = [(method, *(row.get(metric) for row in result["table"])) for method, result in results.items()]
    return ["method", *groups], rows


def baselines_markdown(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The baseline rows, one table per metric (EM, F1, cover-EM; GlobalQA's answer F1 and dF1; searches)
    that some dataset has."""
    parts = ["# Prompting baselines", ""]
    table = next(iter(results.values()))["table"]
    for metric in [m for m in ("em", "f1", "cover_em", "answer_f1", "doc_f1", "searches")
                   if any(m in row for row in table)]:
        parts += [f"## {metric}", "", report.markdown_table(*baseline_rows(results, metric)), ""]
    return "\n".join(parts)


def write_baselines(results: Mapping[str, Mapping[str, Any]], out_dir: str | os.PathLike) -> dict[str, Path]:
    """baselines.md and baselines.json (the tables), and each method's full report in <out>/<method>/."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"baselines.md": out / "baselines.md", "baselines.json": out / "baselines.json"}
    paths["baselines.md"].write_text(baselines_markdown(results))
    tables = {method: {"meta": r["meta"], "table": r["table"]} for method, r in results.items()}
    paths["baselines.json"].write_text(json.dumps(tables, indent=2) + "\n")
    for method, result in results.items():
        for name, path in report.write_report(result, out / method).items():
            paths[f"{method}/{name}"] = path
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    chosen = selection.define(values, "the evaluation's, plus /baselines")
    checkpoint = flags.DEFINE_string("checkpoint", "", "Trainer checkpoint dir, run workdir or Hugging Face "
                                     "model dir (default: the config's policy).", flag_values=values)
    step = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).", flag_values=values)
    methods = flags.DEFINE_list("methods", list(METHODS), f"Baselines to run, of {list(METHODS)}.",
                                flag_values=values)
    chat = flags.DEFINE_bool("chat", False, "Prompt through the tokenizer's chat template (instruct models).",
                             flag_values=values)
    thinking = flags.DEFINE_bool("thinking", None, "Render chat prompts with enable_thinking on (--thinking) "
                                 "or off (--nothinking); default: the template's own.", flag_values=values)
    api_flags = chat_api.define_flags(values)
    cli.parse(values, argv, __doc__)
    config = run_config.parse(chosen.config.value)
    distributed.initialize(config.distributed)
    api = chat_api.config_from_flags(api_flags)
    if api is not None:
        results = evaluate_baselines_api(config, api, methods=methods.value, datasets=chosen.datasets.value,
                                         split=chosen.split.value, limit=chosen.limit.value,
                                         thinking=thinking.value)
        default = Path(config.workdir) / "eval" / chat_api.out_name(api) / "baselines"
    else:
        results, info = evaluate_baselines_checkpoint(
            config, checkpoint.value, step=step.value, methods=methods.value, datasets=chosen.datasets.value,
            split=chosen.split.value, limit=chosen.limit.value, batch_size=chosen.batch_size.value,
            use_chat=chat.value, thinking=thinking.value)
        default = harness.default_out_dir(config, info) / "baselines"
    if jax.process_index() != 0:
        return
    directory = chosen.out.value or default
    paths = write_baselines(results, directory)
    print(baselines_markdown(results))
    print(f"wrote {', '.join(sorted(paths))} to {directory}")


if __name__ == "__main__":
    cli.run(main)
