"""The RPL miniature's scripted cold starts (`searchrl.tasks.rpl.demo`) against the real env, index and tokenizer
of a small world. The whole miniature runs end to end in notebook 04's test (tests/notebooks)."""
from __future__ import annotations

import pytest

from configs import rpl as rpl_configs
from searchrl import experiment, run_config
from searchrl.demo.config import world_config
from searchrl.episode import Turn
from searchrl.tasks.rpl import demo as rpl
from searchrl.tasks.rpl.env import PROGRAM, SEARCH, cited_ids
from searchrl.tasks.rpl.globalqa import TYPES


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small seed's world, GlobalQA files, index and tokenizer, as the demo builds them."""
    config = rpl_configs.get_config("tiny")
    config.workdir = str(tmp_path_factory.mktemp("rpl_demo"))
    config.demo.entities = 300
    seeded = world_config(run_config.parse(config))
    demo = seeded.demo
    prefix_tasks = rpl.build_world(seeded, demo)
    return seeded, demo, prefix_tasks


def test_scripted_cold_starts_answer_with_the_gold_documents_shown(world):
    """Against the real env and index: a program per cold-start window or the two-search plan, the
    observations the env gives, and an answer naming exactly the gold documents shown, in shown order; the
    prefix stage holds each prompt and first turn."""
    seeded, demo, prefix_tasks = world
    assert seeded.env.cite == "rank"
    assert {t["metadata"]["type"] for t in prefix_tasks} == set(TYPES)  # every type's first turns
    for arm, kind in (("program", PROGRAM), ("search", SEARCH)):
        built = experiment.build(rpl.arm_config(seeded, arm, demo))
        examples = built.train_examples[:10]
        trajectories = rpl.scripted_trajectories(examples, built.env, built.tokenizer, demo)
        plans = [(example, plan) for example in examples
                 for plan in rpl.scripted_plans(example, built.env, demo)]
        if arm == "program":
            expected = [[rpl.program_source(e["metadata"]["plan"][0], demo.cold_start_top_k, window)]
                        for e in examples for window in demo.cold_start_windows]
        else:
            expected = [[e["metadata"]["plan"][0], e["metadata"]["value"]] for e in examples]
        assert [[a.content for a in plan] for _, plan in plans] == expected
        assert len(trajectories) == len(plans)
        for (example, plan), segments in zip(plans, trajectories):
            turns = segments[1:-1]
            assert [text for text, _ in turns[::2]] == [f"<{kind}> {a.content} </{kind}>" for a in plan]
            assert [is_policy for _, is_policy in segments] == [False] + [True, False] * len(plan) + [True]
            actions = [built.env.parse_action(rpl.turn_text(a), t) for t, a in enumerate(plan)]
            shown = built.env.observe(actions)
            assert [text for text, _ in turns[1::2]] == [o.text for o in shown]
            ids = [d for o in shown for d in o.info["doc_ids"]]
            gold = [d for d in dict.fromkeys(ids) if d in example["golden_answers"]]
            history = [Turn(t, t + 1, "", a, info=o.info) for t, (a, o) in enumerate(zip(actions, shown))]
            assert cited_ids(segments[-1][0], history) == gold  # cited by the numbers shown
            if arm == "search":
                assert all(len(o.info["doc_ids"]) == built.env.config.search_top_k for o in shown)
        assert [p[:2] for p in trajectories] == rpl.first_turns(examples, built.env, built.tokenizer, demo)


def test_a_scripted_query_writes_the_name_with_the_tokens_of_the_question(world):
    """The copy the cold start teaches is token for token: the group's name has the same tokens in the
    prompt and in the retrieval turn (byte-level BPE attaches the space before a word to it)."""
    seeded, demo, _ = world
    for arm in ("program", "search"):
        built = experiment.build(rpl.arm_config(seeded, arm, demo))
        for example in built.train_examples[:20]:
            name = built.tokenizer.encode(" " + example["metadata"]["value"], add_special_tokens=False)
            [turn] = rpl.first_turns([example], built.env, built.tokenizer, demo)[:1]
            for text, _ in turn:
                ids = built.tokenizer.encode(text, add_special_tokens=False)
                assert any(ids[i:i + len(name)] == name for i in range(len(ids))), (text, name)


def test_seeds_side_by_side_need_a_cold_start_each():
    config = rpl_configs.get_config("tiny")
    config.demo.shared_cold_start = True
    with pytest.raises(ValueError, match=r"config.demo: parallel_seeds=2 needs a cold start per seed"):
        run_config.parse(config)
