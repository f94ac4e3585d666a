"""Search-R1 outcome rewards on a whole response (verl/utils/reward_score/qa_em.py, qa_em_format.py).

The answer is taken from the response alone (`protocol.extract_answer`); Search-R1 instead scans the
prompt + response and skips the prompt's example answer by requiring at least two `<answer>` blocks.
"""
from __future__ import annotations

from searchrl.configlib import group, ranged
from searchrl.text import protocol, qa


@group
class RewardConfig:
    """The scores of `search_r1_reward` (Search-R1's reward_model.* settings); the defaults are those of the
    v0.3 script, scripts/nq_hotpotqa/v0.3/train_ppo_format.sh."""

    structure_format_score: float = ranged(0.2, "(-inf, inf)")  # reward_model.structure_format_score=0.2
    final_format_score: float = ranged(0.1, "(-inf, inf)")  # reward_model.final_format_score=0.1
    retrieval_score: float = ranged(0.0, "(-inf, inf)")  # reward_model.retrieval_score=0


def search_r1_em_reward(response: str, golds: qa.Golds, *, score: float = 1.0,
                        format_score: float = 0.0) -> float:
    """The Search-R1 paper reward (qa_em.py): `score` for an exact match, `format_score` for any other
    extracted answer, 0 when the response has no answer."""
    answer = protocol.extract_answer(response)
    if answer is None:
        return 0.0
    return score if qa.exact_match(answer, golds) else format_score


def retrieval_hit(response: str, golds: qa.Golds) -> bool:
    """True when a normalised gold answer is a substring of some retrieved `<information>` block."""
    return any(qa.cover_em(block, golds) for block in protocol.information_blocks(response))


def search_r1_reward(response: str, golds: qa.Golds, config: RewardConfig, score: float = 1.0) -> float:
    """The format-aware EM reward of qa_em_format.py `compute_score_em`; with its function defaults
    (structure 0.2, final 0.1, retrieval 0.1):

    | extracted answer | valid format                   | invalid format |
    | correct (EM)     | 1                              | 0.8 (1 - 0.2)  |
    | wrong            | 0.2, or 0.3 on a retrieval hit | 0.1            |
    | none             | 0.2, or 0.3 on a retrieval hit | 0              |

    A retrieval hit (a gold answer inside an `<information>` block) counts only for a valid format.
    Search-R1's unused `format_score` argument is left out.
    """
    valid = protocol.check_sequence(response).ok
    structure_format_score = config.structure_format_score
    answer = protocol.extract_answer(response)
    if answer is not None and qa.exact_match(answer, golds):
        return score if valid else score - structure_format_score
    if valid:
        return structure_format_score + (config.retrieval_score if retrieval_hit(response, golds) else 0.0)
    return 0.0 if answer is None else config.final_format_score
