"""AutoSearch turn-level rewards: format/redundancy, answer quality gain, and minimal sufficient depth.

AutoSearch (bofusun/AutoSearch; main_ppo_format_turn_new78.py with qa_em_format_turn6x.py) rewards each
turn on its last token. After every search step j the policy answers the question from the trajectory so
far (an intermediate answer); the first step whose intermediate answer is right is the minimal sufficient
search depth d. Per turn (search turns 1..n, then the answer turn):

- base: a search turn earns +search_format_reward when its format is exact and its query is new, else
  -search_format_reward. A query is redundant when it is empty or its TF-IDF cosine with an earlier query of
  the trajectory exceeds redundancy_threshold (TF-IDF fitted on that query and the earlier ones). The
  answer turn earns answer_format_reward / answer_format_penalty, plus correct_answer_reward when the final
  answer is an exact match.
- quality: search turn j earns quality_coef * max(0, F1_j - max_{i<j} F1_i), F1_j being the token F1 of
  intermediate answer j (0 before any step).
- efficiency, on "valid" turns (a well-formed new query, a well-formed answer; whatever the coefficients):
  * final answer correct, no search: the answer turn earns efficiency_budget.
  * final answer correct, d < n: valid turns 1..d earn efficiency_budget / d - efficiency_step_cost each;
    every later turn (searches d+1..n and the answer turn) gets -efficiency_overshoot_penalty.
  * final answer correct, no d < n (every search was needed): every valid turn, the answer turn included,
    earns efficiency_budget / n - efficiency_step_cost.
  * final answer wrong: every valid turn earns efficiency_wrong_answer_reward.
  * every search turn (valid or not) pays search_step_penalty, whatever the depth and the answer: 0 in
    AutoSearch; with the depth terms off (`EFFICIENCY_OFF`) it is the fixed per-search cost that AutoSearch
    argues against (it charges needed searches as much as unneeded ones). Not in the public code.

Differences from the public code, on purpose (`public_code=True` restores each one, see `public_rewards`):
- The public code overwrites the whole reward of each turn after d with the penalty, which erases the answer
  turn's +1, and does so whether or not the final answer is right. By default the penalty is added, and only
  when the final answer is right.
- Invalid turns among 1..d are skipped (the public code stops paying at the first one).
- A row without a search earns the efficiency terms too (correct: the budget when the answer is well-formed;
  wrong: the small constant); the public code pays no efficiency reward to a row without an observation.
- F1 (with the HotpotQA yes/no rule) and the depth's EM use every gold answer; the public code uses the
  first gold only, plain token F1 rounded to 4 places.
- A query with no word of two or more characters is redundant; empty earlier queries are not part of the
  TF-IDF fit (the public code puts a placeholder "None" document in their place, and never calls the first
  query redundant).
- A row that ran out of turns without an answer turn gets the answer slot's reward on its last turn on top
  of that turn's search reward; the public code scores its last turn as the answer turn only.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Sequence

import numpy as np

from searchrl.configlib import group, ranged
from searchrl.text import protocol, qa

# scikit-learn's TfidfVectorizer default tokens: lower-cased runs of two or more word characters.
_TFIDF_TOKEN = re.compile(r"(?u)\b\w\w+\b")


@group
class RewardConfig:
    """AutoSearch reward coefficients (values from the public training code)."""

    # base: per search turn, +value for exact format and a new query, -value otherwise
    # (structure_format_score / 8 with structure_format_score = 0.2).
    search_format_reward: float = ranged(0.025, "(-inf, inf)")
    # base: TF-IDF cosine above which a query repeats an earlier one.
    redundancy_threshold: float = ranged(0.8, "[0, 1]")
    # base: answer turn format reward (final_format_score = 0.1) and penalty for a malformed answer turn.
    answer_format_reward: float = ranged(0.1, "(-inf, inf)")
    answer_format_penalty: float = ranged(-0.5, "(-inf, inf)")
    # base: answer turn reward for a final answer that exactly matches a gold answer.
    correct_answer_reward: float = ranged(1.0, "(-inf, inf)")
    # quality: scale of the per-step F1 gain of the intermediate answers.
    quality_coef: float = ranged(1.0, "(-inf, inf)")
    # efficiency: bonus shared by the needed steps; each needed step earns budget / depth - step_cost
    # (the public code's 0.5 * (0.4 / depth - 0.05)); a correct answer with no search earns the budget.
    efficiency_budget: float = ranged(0.2, "(-inf, inf)")
    efficiency_step_cost: float = ranged(0.025, "(-inf, inf)")
    # efficiency: penalty for each turn after the minimal sufficient depth d.
    efficiency_overshoot_penalty: float = ranged(0.05, "(-inf, inf)")
    # efficiency: small constant on each valid turn when the final answer is wrong (keeps searching alive).
    efficiency_wrong_answer_reward: float = ranged(0.0125, "(-inf, inf)")
    # efficiency: a fixed cost on every search turn (a step-penalty baseline, not AutoSearch's; 0 = off).
    search_step_penalty: float = ranged(0.0, "(-inf, inf)")
    # True: the public code's reward exactly (`public_rewards`): each turn after d gets exactly -penalty
    # (its base, quality and answer rewards erased), F1 and d against the first gold, and the rest of the
    # differences listed in the module docstring.
    public_code: bool = False

    def __post_init__(self):
        if self.public_code and self.search_step_penalty:
            raise ValueError(f"RewardConfig.search_step_penalty={self.search_step_penalty} has no meaning "
                             "with public_code=True: the public code has no per-search cost")


# The efficiency terms off, AutoSearch's no-efficiency ablation: `dataclasses.replace(cfg, **EFFICIENCY_OFF)`.
EFFICIENCY_OFF = dict(efficiency_budget=0.0, efficiency_step_cost=0.0, efficiency_overshoot_penalty=0.0,
                      efficiency_wrong_answer_reward=0.0)


@dataclasses.dataclass(frozen=True)
class SearchTurn:
    """One search turn: the generated text (without the observation), its query, and its format check."""

    text: str
    query: str | None
    format_ok: bool


@dataclasses.dataclass(frozen=True)
class AnswerTurn:
    """The final turn: the generated text and whether it is `<think>..</think><answer>..</answer>`."""

    text: str
    format_ok: bool


@dataclasses.dataclass(frozen=True)
class AutoSearchRecord:
    """Everything the reward needs about one trajectory.

    intermediate_answers[j] is the answer produced from the trajectory up to search turn j (None when
    none was produced). answer_turn is None when the trajectory ran out of turns before answering.
    """

    search_turns: Sequence[SearchTurn]
    answer_turn: AnswerTurn | None
    intermediate_answers: Sequence[str | None]
    golds: Sequence[str]

    def __post_init__(self):
        if len(self.intermediate_answers) != len(self.search_turns):
            raise ValueError(f"intermediate_answers has {len(self.intermediate_answers)} entries for "
                             f"{len(self.search_turns)} search turns")
        if not self.search_turns and self.answer_turn is None:
            raise ValueError("a trajectory needs at least one turn")


@dataclasses.dataclass(frozen=True)
class AutoSearchRewards:
    """Per-turn rewards, in turn order; `total` goes on each turn's last token."""

    total: list[float]
    base: list[float]
    quality: list[float]
    efficiency: list[float]
    minimal_depth: int | None  # d (1-based) when an intermediate answer was right before the last search
    final_correct: bool


def tfidf_vectors(docs: Sequence[str]) -> np.ndarray:
    """L2-normalised TF-IDF rows of `docs`, fitted on `docs` (scikit-learn defaults, smooth idf):
    tf = raw count, idf = ln((1 + n) / (1 + df)) + 1."""
    tokens = [_TFIDF_TOKEN.findall(d.lower()) for d in docs]
    vocab = {t: i for i, t in enumerate(sorted({t for toks in tokens for t in toks}))}
    tf = np.zeros((len(docs), len(vocab)))
    for row, toks in enumerate(tokens):
        for tok, count in collections.Counter(toks).items():
            tf[row, vocab[tok]] = count
    df = (tf > 0).sum(axis=0)
    weights = tf * (np.log((1 + len(docs)) / (1 + df)) + 1)
    norms = np.linalg.norm(weights, axis=1, keepdims=True)
    return np.divide(weights, norms, out=np.zeros_like(weights), where=norms > 0)


def is_redundant(query: str | None, earlier: Sequence[str | None], threshold: float) -> bool:
    """True when the normalised query is empty, or its TF-IDF cosine with an earlier query exceeds
    `threshold`."""
    query = qa.normalize_answer(query or "")
    if not _TFIDF_TOKEN.search(query):
        return True
    history = [h for h in (qa.normalize_answer(e or "") for e in earlier) if h]
    if not history:
        return False
    vectors = tfidf_vectors([query, *history])
    return float(np.max(vectors[1:] @ vectors[0])) > threshold


def _valid_turns(record: AutoSearchRecord, cfg: RewardConfig) -> list[bool]:
    """Per search turn, exact format and a new query; then whether the answer turn is well-formed."""
    queries = [t.query for t in record.search_turns]
    searches = [turn.format_ok and not is_redundant(turn.query, queries[:j], cfg.redundancy_threshold)
                for j, turn in enumerate(record.search_turns)]
    return searches + [record.answer_turn is not None and record.answer_turn.format_ok]


def _format_rewards(valid: Sequence[bool], cfg: RewardConfig) -> list[float]:
    """Format/redundancy reward per search turn, then the answer turn's format reward."""
    searches = [cfg.search_format_reward if ok else -cfg.search_format_reward for ok in valid[:-1]]
    return searches + [cfg.answer_format_reward if valid[-1] else cfg.answer_format_penalty]


def _quality_rewards(record: AutoSearchRecord, cfg: RewardConfig) -> list[float]:
    """Per search step, the scaled gain of the intermediate answer's F1 over the best earlier F1."""
    best, gains = 0.0, []
    for answer in record.intermediate_answers:
        score = qa.f1(answer, record.golds) if answer is not None else 0.0
        gains.append(cfg.quality_coef * max(0.0, score - best))
        best = max(best, score)
    return gains + [0.0]


def minimal_depth(record: AutoSearchRecord) -> int | None:
    """The first search step d (1-based) whose intermediate answer is an exact match, if d < n."""
    n = len(record.search_turns)
    for j, answer in enumerate(record.intermediate_answers[:max(n - 1, 0)]):
        if answer is not None and qa.exact_match(answer, record.golds):
            return j + 1
    return None


def _efficiency_rewards(valid: Sequence[bool], depth: int | None, final_correct: bool,
                        cfg: RewardConfig) -> list[float]:
    """Efficiency reward per turn (search turns then the answer turn)."""
    n = len(valid) - 1
    if not final_correct:
        return [cfg.efficiency_wrong_answer_reward if ok else 0.0 for ok in valid]
    if n == 0:
        return [cfg.efficiency_budget if valid[0] else 0.0]
    needed = depth if depth is not None else n
    step = cfg.efficiency_budget / needed - cfg.efficiency_step_cost
    if depth is None:
        return [step if ok else 0.0 for ok in valid]
    return [(step if ok else 0.0) if t < depth else -cfg.efficiency_overshoot_penalty
            for t, ok in enumerate(valid)]


def _fold_missing_answer(values: list[float], has_answer_turn: bool) -> list[float]:
    """Without an answer turn, the answer slot's reward lands on the last (search) turn."""
    if has_answer_turn:
        return values
    return values[:-2] + [values[-2] + values[-1]]


def _final_correct(record: AutoSearchRecord) -> bool:
    """Whether the answer turn's answer is an exact match of some gold answer."""
    answer = protocol.extract_answer(record.answer_turn.text) if record.answer_turn else None
    return answer is not None and bool(qa.exact_match(answer, record.golds))


def autosearch_rewards(record: AutoSearchRecord, cfg: RewardConfig = RewardConfig()
                       ) -> AutoSearchRewards:
    """Per-turn AutoSearch rewards: one entry per search turn, then one for the answer turn (when the
    trajectory has one). The components always sum to `total`."""
    if cfg.public_code:
        return public_rewards(record, cfg)
    final_correct = _final_correct(record)
    depth = minimal_depth(record)
    valid = _valid_turns(record, cfg)
    fmt = _format_rewards(valid, cfg)
    base = fmt[:-1] + [fmt[-1] + (cfg.correct_answer_reward if final_correct else 0.0)]
    quality = _quality_rewards(record, cfg)
    efficiency = _efficiency_rewards(valid, depth, final_correct, cfg)
    efficiency = [e - cfg.search_step_penalty for e in efficiency[:-1]] + efficiency[-1:]
    has_answer_turn = record.answer_turn is not None
    base, quality, efficiency = (_fold_missing_answer(v, has_answer_turn)
                                 for v in (base, quality, efficiency))
    total = [b + q + e for b, q, e in zip(base, quality, efficiency)]
    return AutoSearchRewards(total=total, base=base, quality=quality, efficiency=efficiency,
                             minimal_depth=depth, final_correct=final_correct)


# The public code (bofusun/AutoSearch: verl/trainer/main_ppo_format_turn_new78.py, its RewardManager, with
# verl/utils/reward_score/qa_em_format_turn62.py), reproduced on the same record. Its rollout gives every
# turn but the last an observation (a search's passages or the invalid-action message) and an intermediate
# answer; the last turn is scored as the answer turn.


def public_is_redundant(query: str | None, earlier: Sequence[str | None], threshold: float) -> bool:
    """qa_em_format_turn62.is_repeat_part: never for the first query; else an empty normalised query, or a
    TF-IDF cosine above `threshold` with an earlier query (an empty one fitted as the document "None"; no
    word of two or more characters anywhere counts as a repeat, scikit-learn's empty-vocabulary error)."""
    if not earlier:
        return False
    query = qa.normalize_answer(query or "")
    if not query:
        return True
    docs = [query, *(qa.normalize_answer(e or "") or "None" for e in earlier)]
    if not any(_TFIDF_TOKEN.search(d.lower()) for d in docs):
        return True
    vectors = tfidf_vectors(docs)
    return float(np.max(vectors[1:] @ vectors[0])) > threshold


def public_f1(prediction: str | None, gold: str) -> float:
    """RewardManager.query_f1_score against one gold: plain token F1 (no yes/no rule), rounded to 4 places."""
    if prediction is None:
        return 0.0
    pred, ref = qa.normalize_answer(prediction).split(), qa.normalize_answer(gold).split()
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return round(2 * precision * recall / (precision + recall), 4)


def _public_quality_and_depth(answers: Sequence[str | None], gold: str, cfg: RewardConfig
                              ) -> tuple[list[float], int | None]:
    """The F1 gains of the intermediate answers against the first gold, and the 0-based step d0 of the first
    exact match before the last step (the gains stop after it)."""
    best, gains = 0.0, []
    for t, answer in enumerate(answers):
        score = public_f1(answer, gold)
        gains.append(cfg.quality_coef * max(0.0, score - best))
        best = max(best, score)
        if t < len(answers) - 1 and answer is not None and qa.exact_match(answer, gold):
            return gains + [0.0] * (len(answers) - t - 1), t
    return gains, None


def _public_efficiency(valid: Sequence[bool], depth: int | None, final_correct: bool,
                       cfg: RewardConfig) -> list[float]:
    """The efficiency the public code adds per turn (before the overwrite after d0 = `depth`). A row with no
    observation gets none (its no-search +budget branch needs one turn with an observation: unreachable)."""
    if len(valid) == 1:
        return [0.0]
    if not final_correct:
        return [cfg.efficiency_wrong_answer_reward if ok else 0.0 for ok in valid]
    if depth is None:
        step = cfg.efficiency_budget / (len(valid) - 1) - cfg.efficiency_step_cost
        return [step if ok else 0.0 for ok in valid]
    step = cfg.efficiency_budget / (depth + 1) - cfg.efficiency_step_cost
    paid = next((t for t, ok in enumerate(valid[:depth + 1]) if not ok), depth + 1)  # up to the first invalid
    return [step] * paid + [0.0] * (len(valid) - paid)


def public_rewards(record: AutoSearchRecord, cfg: RewardConfig) -> AutoSearchRewards:
    """The public code's per-turn rewards (see above): one entry per turn, the last scored as the answer."""
    turns = [*record.search_turns, *([record.answer_turn] if record.answer_turn else [])]
    queries = [t.query for t in record.search_turns]
    valid = [turn.format_ok and not public_is_redundant(turn.query, queries[:j], cfg.redundancy_threshold)
             for j, turn in enumerate(turns[:-1])]
    valid.append(record.answer_turn is not None and record.answer_turn.format_ok)
    final_correct = _final_correct(record)
    fmt = _format_rewards(valid, cfg)
    base = fmt[:-1] + [fmt[-1] + (cfg.correct_answer_reward if final_correct else 0.0)]
    gold = record.golds[0] if record.golds else ""
    quality, depth = _public_quality_and_depth(record.intermediate_answers[:len(turns) - 1], gold, cfg)
    quality.append(0.0)
    efficiency = _public_efficiency(valid, depth, final_correct, cfg)
    if depth is not None:  # every later turn's reward becomes the penalty
        for t in range(depth + 1, len(turns)):
            efficiency[t] = -cfg.efficiency_overshoot_penalty - base[t] - quality[t]
    total = [b + q + e for b, q, e in zip(base, quality, efficiency)]
    return AutoSearchRewards(total=total, base=base, quality=quality, efficiency=efficiency,
                             minimal_depth=None if depth is None else depth + 1, final_correct=final_correct)
