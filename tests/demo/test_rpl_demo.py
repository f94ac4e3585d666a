"""The RPL miniature's scripted cold starts (`searchrl.demo.rpl`) against the real env, index and tokenizer
of a small world. The whole miniature runs end to end in notebook 04's test (tests/notebooks)."""
from __future__ import annotations

import pytest

from configs import rpl as rpl_configs
from searchrl import experiment
from searchrl.configlib import from_config
from searchrl.demo import rpl
from searchrl.demo.config import RPLDemoConfig, seed_config
from searchrl.demo.globalqa import TYPES
from searchrl.envs.program import PROGRAM, SEARCH, parse_ids


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small seed's world, GlobalQA files, index and tokenizer, as the demo builds them."""
    config = rpl_configs.get_config("tiny")
    config.workdir = str(tmp_path_factory.mktemp("rpl_demo"))
    config.demo.entities = 300
    demo = from_config(RPLDemoConfig, config.demo, "config.demo")
    seeded = seed_config(config, 0)
    prefix_tasks = rpl.build_world(seeded, demo)
    return seeded, demo, prefix_tasks


def test_scripted_cold_starts_answer_with_the_gold_documents_shown(world):
    """Against the real env and index: a program per cold-start top_k or the two-search plan, the
    observations the env gives, and an answer naming exactly the gold documents shown, in shown order; the
    prefix stage holds each prompt and first turn."""
    seeded, demo, prefix_tasks = world
    assert {t["metadata"]["type"] for t in prefix_tasks} == set(TYPES)  # every type's first turns
    for arm, kind in (("program", PROGRAM), ("search", SEARCH)):
        built = experiment.build(rpl.arm_config(seeded, arm, demo))
        examples = built.train_examples[:10]
        trajectories = rpl.scripted_trajectories(examples, built.env, built.tokenizer, demo)
        plans = [(example, plan) for example in examples
                 for plan in rpl.scripted_plans(example, built.env, demo)]
        if arm == "program":
            expected = [[rpl.program_source(e["metadata"]["plan"][0], k)]
                        for e in examples for k in demo.cold_start_top_k]
        else:
            expected = [[e["metadata"]["plan"][0], e["metadata"]["value"]] for e in examples]
        assert [[a.content for a in plan] for _, plan in plans] == expected
        assert len(trajectories) == len(plans)
        for (example, plan), segments in zip(plans, trajectories):
            turns = segments[1:-1]
            assert [text for text, _ in turns[::2]] == [f"<{kind}>{a.content}</{kind}>" for a in plan]
            assert [is_policy for _, is_policy in segments] == [False] + [True, False] * len(plan) + [True]
            shown = built.env.observe(plan)
            assert [text for text, _ in turns[1::2]] == [o.text for o in shown]
            ids = [d for o in shown for d in o.info["doc_ids"]]
            gold = [d for d in dict.fromkeys(ids) if d in example["golden_answers"]]
            assert parse_ids(segments[-1][0]) == gold
            if arm == "search":
                assert all(len(o.info["doc_ids"]) == built.env.config.search_top_k for o in shown)
        assert [p[:2] for p in trajectories] == rpl.first_turns(examples, built.env, built.tokenizer, demo)
