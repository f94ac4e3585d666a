"""AutoSearch's RL baselines as rewards of the same search env: StepSearch and HiPRAG
(`config.env.reward = "stepsearch" | "hiprag"`, registered in `searchrl.tasks.autosearch.env`).

StepSearch (Wang et al. 2025, "StepSearch: Igniting LLMs Search Ability via Step-Wise Proximal Policy
Optimization"; github.com/Zillwang/StepSearch [SS]: verl/utils/reward_score/qa_step.py
`compute_score_f1_steps_plan_with_support_docs`, verl/trainer/main_ppo.py `RewardManager`, train.sh):

- a response that does not end with an answer turn scores `format_penalty` (-1) on its last turn, and nothing
  else;
- otherwise its last turn gets F1(answer) + search_key_coef * K, with F1 the best token F1 over the golds
  (rounded to 4 places, no yes/no rule, as [SS]'s `query_f1_score`) and K the search-key score: each
  `<search>` query is matched to the gold key group (a sub-question's search keys, in the example's metadata)
  it has the best F1 with, and that group's score becomes this F1 (a later query replaces an earlier one's
  score of the same group, as [SS] does); K is the mean over the groups (0 without keys);
- each search turn t gets step_reward_scale * (information_gain_coef * G_t - redundancy_coef * P_t) on its
  last token (`</search>`): with m_t[g] the best match of gold passage g among step t's passages,
  G_t = mean_g max(0, m_t[g] - max_{s<t} m_s[g]), and P_t the share of step t's passages retrieved before
  (earlier in the trajectory or in the same step). Without gold passages there is no step reward ([SS]).

  Differences from [SS], on purpose: a passage matches a gold passage by the TF-IDF cosine of their
  SQuAD-normalised texts ([SS]'s `subm_tfidf_cosine`) when the example gives gold texts, or by corpus id (1
  for the same id, else 0) when it gives only gold ids (the synthetic world does); a passage is "retrieved
  before" when its corpus id was ([SS] compares the passage texts); passage texts are read back from the
  observation as the policy saw it, as [SS] reads them from the decoded response; queries are read from the
  policy's turns only ([SS] also reads the invalid-action message's "<search> and </search>").

HiPRAG (Wu et al. 2025, "HiPRAG: Hierarchical Process Rewards for Efficient Agentic Retrieval Augmented
Generation"; github.com/qualidea1217/HiPRAG [HP]: verl/utils/reward_score/qa_em_format.py `compute_score_em`,
`search_r1_format`; scripts/nq_hotpotqa/v0.3/train_ppo_format.sh): one score on the last turn,

    R = A (1 - format_weight) + format_weight F + process_coef A F N_corr / N,

A the cover-EM of the final answer (a gold answer inside it), F the response's format check, N the steps
and N_corr those that are neither over-search nor under-search. Steps are the turns: a search turn is a
search step, any other turn (the answer turn, an invalid turn) a non-search step.

  How the step judgement differs from the paper, which asks an external LLM: a search step is an over-search
  when the intermediate answer of the search step before it (the env's side branch, answered from the
  trajectory so far) already covers a gold answer, i.e. the policy knew the answer before searching (the
  paper re-asks the policy the query without retrieval and has a judge compare that answer with the step's
  conclusion); the first search step has no earlier answer and is never an over-search. A non-search step is
  an under-search when it does not state a right answer: the answer turn with a wrong final answer, or an
  invalid turn (the paper has a judge check the step's reasoning). The format F is Search-R1's
  (`protocol.check_sequence`), not [HP]'s `<step>` layout. Under the gate (A F = 1) the answer turn is right,
  so within Search-R1's turn format the bonus measures over-search only. [HP]'s code divides N_corr by the
  number of search steps (and pays the whole bonus when there is none); this follows the paper's N.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from searchrl import configlib
from searchrl.episode import Turn
from searchrl.tasks.autosearch import rewards
from searchrl.text import protocol, qa, tags


@configlib.group
class StepSearchConfig:
    """`config.env.stepsearch`: StepSearch's coefficients ([SS], module doc) and where examples hold its
    gold data."""

    # Per-step rewards' scale: RewardManager(step_reward_scale=0.6) [SS main_ppo.py], built with its default.
    step_reward_scale: float = configlib.ranged(0.6, "(-inf, inf)")
    # trainer.information_gain=true and trainer.redundancy_penalty=true [SS train.sh]: 1 on, 0 off.
    information_gain_coef: float = configlib.ranged(1.0, "(-inf, inf)")
    redundancy_coef: float = configlib.ranged(1.0, "(-inf, inf)")
    # search_keys_score=0.618 [SS qa_step.py], on with trainer.search_key_reward=true [SS train.sh].
    search_key_coef: float = configlib.ranged(0.618, "(-inf, inf)")
    # 'score': -1 when the response does not end with an answer (answer_last_check) [SS qa_step.py].
    format_penalty: float = configlib.ranged(-1.0, "(-inf, inf)")
    # Example metadata fields: the sub-questions' search key groups (each a string or a list of its
    # expressions; [SS]'s ground_truth.search_keys), the gold passages as texts (strings or
    # {"paragraph_text": ...}; [SS]'s extra_info.support_docs) and as corpus ids.
    search_keys_field: str = "search_keys"
    support_docs_field: str = "support_docs"
    support_ids_field: str = "supporting_ids"


@configlib.group
class HiPRAGConfig:
    """`config.env.hiprag`: HiPRAG's coefficients ([HP], module doc)."""

    # lambda_f: reward_model.structure_format_score=0.2 [HP train_ppo_format.sh], search_r1_format's weight.
    format_weight: float = configlib.ranged(0.2, "(-inf, inf)")
    # lambda_p: 0.4 in compute_score_em [HP qa_em_format.py]; the paper's main runs use lambda_p = 0.4.
    process_coef: float = configlib.ranged(0.4, "(-inf, inf)")


# ---- StepSearch ----

@dataclasses.dataclass(frozen=True)
class Retrieval:
    """One search step's passages as the policy saw them: corpus ids, and texts without their titles."""

    ids: tuple[str, ...]
    texts: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StepSearchRecord:
    """What StepSearch's reward reads of one trajectory. steps[t] is turn t's passages when it searched, else
    None; `answered`: the last turn is an answer turn."""

    steps: Sequence[Retrieval | None]
    answered: bool
    answer: str
    queries: Sequence[str]
    golds: Sequence[str]
    search_keys: Sequence[Sequence[str]] = ()
    gold_texts: Sequence[str] = ()
    gold_ids: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class StepSearchRewards:
    """Per-turn rewards (`total`) and their parts: one gain and one penalty per search step (none without
    gold passages)."""

    total: list[float]
    answer_f1: float
    search_key_score: float
    information_gains: list[float]
    redundancy: list[float]


def answer_f1(prediction: str | None, golds: Sequence[str]) -> float:
    """[SS]'s `query_f1_score`: the best plain token F1 over the golds, rounded to 4 places."""
    return max((rewards.public_f1(prediction, gold) for gold in golds), default=0.0)


def search_key_score(queries: Sequence[str], keys: Sequence[Sequence[str]]) -> float:
    """[SS]'s `step_search_keys_match`: each query sets the score of the key group it matches best (its F1
    with that group's best expression; a query matching none sets nothing) and the mean over groups."""
    if not queries or not keys:
        return 0.0
    matched = [0.0] * len(keys)
    for query in queries:
        best, group = 0.0, None
        for i, expressions in enumerate(keys):
            score = answer_f1(query, expressions)
            if score > best:
                best, group = score, i
        if group is not None:
            matched[group] = best
    return sum(matched) / len(keys)


def match_degrees(step: Retrieval, gold_texts: Sequence[str], gold_ids: Sequence[str]) -> np.ndarray:
    """Per gold passage, its best match among the step's passages: the TF-IDF cosine of the normalised texts,
    fitted on one passage and every gold ([SS]'s `subm_tfidf_cosine`), when gold texts are given; else 1 for a
    passage with the gold's corpus id."""
    if not gold_texts:
        return np.array([float(g in step.ids) for g in gold_ids])
    golds = [qa.normalize_answer(g) for g in gold_texts]
    best = np.zeros(len(golds))
    for text in step.texts:
        text = qa.normalize_answer(text)
        if text:
            vectors = rewards.tfidf_vectors([text, *golds])
            best = np.maximum(best, vectors[1:] @ vectors[0])
    return best


def information_gains(degrees: Sequence[np.ndarray]) -> list[float]:
    """Per step, the mean over gold passages of the rise of their best match above the earlier steps' best."""
    gains, best = [], np.zeros_like(degrees[0]) if degrees else None
    for step in degrees:
        gains.append(float(np.mean(np.maximum(step - best, 0.0))))
        best = np.maximum(best, step)
    return gains


def redundancy_penalties(steps: Sequence[Sequence[str]]) -> list[float]:
    """Per step, the share of its passages (by id) already retrieved, earlier or earlier in the same step."""
    seen: set[str] = set()
    penalties = []
    for ids in steps:
        penalty = 0.0
        for doc in ids:
            if doc in seen:
                penalty += 1 / len(ids)
            seen.add(doc)
        penalties.append(penalty)
    return penalties


def stepsearch_rewards(record: StepSearchRecord, cfg: StepSearchConfig = StepSearchConfig()
                       ) -> StepSearchRewards:
    """StepSearch's per-turn rewards (module doc): step rewards on search turns, the outcome on the last."""
    total, f1 = [0.0] * len(record.steps), answer_f1(record.answer, record.golds)
    if not record.answered:
        total[-1] = cfg.format_penalty
        return StepSearchRewards(total, f1, 0.0, [], [])
    key = search_key_score(record.queries, record.search_keys)
    searches = [t for t, step in enumerate(record.steps) if step is not None]
    gains, penalties = [], []
    if record.gold_texts or record.gold_ids:
        steps = [record.steps[t] for t in searches]
        gains = information_gains([match_degrees(s, record.gold_texts, record.gold_ids) for s in steps])
        penalties = redundancy_penalties([s.ids for s in steps])
    for t, gain, penalty in zip(searches, gains, penalties):
        total[t] = cfg.step_reward_scale * (cfg.information_gain_coef * gain - cfg.redundancy_coef * penalty)
    total[-1] += f1 + cfg.search_key_coef * key
    return StepSearchRewards(total, f1, key, gains, penalties)


def observed_passages(observation: str, count: int) -> tuple[str, ...]:
    """The texts of the `count` passages of a search observation, read back from Search-R1's layout
    (`Doc i(Title: <title>) <text>`, `search_r1.env.format_passages`) without their titles, as the policy saw
    them; a passage that the observation's truncation cut off entirely is ""."""
    opening, closing = tags.open_tag(tags.INFORMATION), tags.close_tag(tags.INFORMATION)
    start = observation.find(opening)
    block = "" if start < 0 else observation[start + len(opening):].partition(closing)[0]
    starts = []
    for i in range(1, count + 1):
        at = block.find(f"Doc {i}(Title: ", starts[-1] if starts else 0)
        if at < 0:
            break
        starts.append(at)
    pieces = [block[a:b] for a, b in zip(starts, starts[1:] + [len(block)])]
    texts = [piece.partition(") ")[2].strip() for piece in pieces]
    return tuple(texts + [""] * (count - len(texts)))


def _metadata_list(example: Mapping[str, Any], field: str) -> list[Any]:
    """metadata[field] of an example as a list ([] when absent); anything but a list is an error."""
    value = (example.get("metadata") or {}).get(field)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"Question {example.get('id')!r}: metadata.{field} must be a list, got {value!r}")
    return list(value)


def _strings(values: Sequence[Any], example: Mapping[str, Any], field: str) -> list[str]:
    """`values` when every one is a string, else an error naming the field and example."""
    for value in values:
        if not isinstance(value, str):
            raise ValueError(f"Question {example.get('id')!r}: metadata.{field} holds {value!r}, "
                             "not a string")
    return list(values)


def search_keys(example: Mapping[str, Any], field: str) -> list[list[str]]:
    """The example's search key groups: each item of metadata[field], a string or a list of strings."""
    groups = [[g] if isinstance(g, str) else g for g in _metadata_list(example, field)]
    for group in groups:
        if not isinstance(group, (list, tuple)):
            raise ValueError(f"Question {example.get('id')!r}: metadata.{field} holds {group!r}, "
                             "not a string or a list of strings")
    return [_strings(group, example, field) for group in groups]


def support_docs(example: Mapping[str, Any], field: str) -> list[str]:
    """The example's gold passage texts: metadata[field] items, strings or {"paragraph_text": ...}."""
    docs = [d.get("paragraph_text") if isinstance(d, Mapping) else d for d in _metadata_list(example, field)]
    return _strings(docs, example, field)


def stepsearch_record(turns: Sequence[Turn], example: Mapping[str, Any], cfg: StepSearchConfig
                      ) -> StepSearchRecord:
    """The StepSearch view of one row: each search turn's passages (ids from the observation's info, texts
    from its text), the final answer, every query of the policy's turns and the example's gold data."""
    steps = []
    for turn in turns:
        ids = tuple(turn.info.get("doc_ids", ())) if turn.action.kind == tags.SEARCH else None
        steps.append(None if ids is None else Retrieval(ids, observed_passages(turn.observation, len(ids))))
    last = turns[-1].action
    return StepSearchRecord(
        steps=steps, answered=last.kind == tags.ANSWER, answer=protocol.final_answer(turns),
        queries=[q for turn in turns for q in protocol.extract_queries(turn.text)],
        golds=list(example["golden_answers"]), search_keys=search_keys(example, cfg.search_keys_field),
        gold_texts=support_docs(example, cfg.support_docs_field),
        gold_ids=_strings(_metadata_list(example, cfg.support_ids_field), example, cfg.support_ids_field))


# ---- HiPRAG ----

@dataclasses.dataclass(frozen=True)
class HiPRAGRewards:
    """The row's score and what it counted: per step, whether it was an over- or an under-search."""

    score: float
    answer_correct: bool
    format_ok: bool
    over_search: list[bool]
    under_search: list[bool]


def step_judgements(record: rewards.AutoSearchRecord) -> tuple[list[bool], list[bool]]:
    """Per step (the turns: search turns, then the answer turn when there is one), whether it is an
    over-search (a search after a search step whose intermediate answer already covered a gold answer) and
    whether it is an under-search (a non-search step that does not state a right answer)."""
    over, under, before = [], [], None
    for turn, answer in zip(record.search_turns, record.intermediate_answers):
        searched = turn.query is not None
        over.append(searched and before is not None and bool(qa.cover_em(before, record.golds)))
        under.append(not searched)
        before = answer if searched else before
    if record.answer_turn is not None:
        final = protocol.extract_answer(record.answer_turn.text)
        over.append(False)
        under.append(final is None or not qa.cover_em(final, record.golds))
    return over, under


def hiprag_rewards(record: rewards.AutoSearchRecord, format_ok: bool, cfg: HiPRAGConfig = HiPRAGConfig()
                   ) -> HiPRAGRewards:
    """HiPRAG's score of one trajectory (module doc); `format_ok`: the whole response's format check."""
    final = protocol.extract_answer(record.answer_turn.text) if record.answer_turn else None
    correct = final is not None and bool(qa.cover_em(final, record.golds))
    over, under = step_judgements(record)
    optimal = sum(not (o or u) for o, u in zip(over, under)) / len(over)
    a, f = float(correct), float(format_ok)
    score = a * (1 - cfg.format_weight) + cfg.format_weight * f + cfg.process_coef * a * f * optimal
    return HiPRAGRewards(score, correct, format_ok, over, under)
