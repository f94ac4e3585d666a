"""Rewards computed on the host from text: QA metrics, the search-QA protocol, Search-R1, AutoSearch and
DeepRetrieval rewards."""
from searchrl.rewards.protocol import (FormatCheck, check_sequence, check_turn, extract_answer,
                                       extract_queries, information_blocks, response_part)
from searchrl.rewards.qa import cover_em, exact_match, f1, has_answer, normalize_answer
from searchrl.rewards.search_r1 import search_r1_em_reward, search_r1_reward

__all__ = [
    "FormatCheck", "check_sequence", "check_turn", "cover_em", "exact_match", "extract_answer",
    "extract_queries", "f1", "has_answer", "information_blocks", "normalize_answer", "response_part",
    "search_r1_em_reward", "search_r1_reward",
]
