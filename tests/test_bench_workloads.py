"""`bench serve`'s workloads (bench/workloads.py): the prompts each dataset promises, checked
against its description (lengths, what is shared, what is not, labels), without a server."""

from collections import Counter

import pytest

from v4serve.bench.workloads import (TOKEN_RANGE, multi_turn_workload, prefix_repetition_workload,
                                     random_workload)


def _prompts(sessions):
    return [turn.prompt for session in sessions for turn in session]


def test_random_prompts_are_one_turn_each_of_the_length_asked_and_in_range():
    sessions = random_workload(5, 37, seed=3)
    assert [len(s) for s in sessions] == [1] * 5
    prompts = _prompts(sessions)
    assert all(len(p) == 37 for p in prompts)
    assert all(TOKEN_RANGE[0] <= t < TOKEN_RANGE[1] for p in prompts for t in p)
    assert len({tuple(p[:8]) for p in prompts}) == 5  # nothing shared
    assert _prompts(random_workload(5, 37, seed=3)) == prompts
    assert _prompts(random_workload(5, 37, seed=4)) != prompts


@pytest.mark.parametrize("num_requests, num_prefixes", [(10, 3), (4, 4), (7, 1)])
def test_prefix_repetition_shares_each_prefix_and_nothing_after_it(num_requests, num_prefixes):
    prefix_len, suffix_len = 48, 9
    sessions = prefix_repetition_workload(num_requests, prefix_len, suffix_len, num_prefixes, seed=1)
    assert len(sessions) == num_requests and all(len(s) == 1 for s in sessions)
    prompts = _prompts(sessions)
    assert all(len(p) == prefix_len + suffix_len for p in prompts)
    uses = Counter(tuple(p[:prefix_len]) for p in prompts)
    assert len(uses) == num_prefixes
    # num_requests // num_prefixes prompts per prefix, the remainder one more each
    assert sorted(uses.values()) == sorted(num_requests // num_prefixes + (i < num_requests % num_prefixes)
                                           for i in range(num_prefixes))
    assert len({tuple(p[prefix_len:]) for p in prompts}) == num_requests  # every suffix its own
    # the first prompt of each prefix in send order is "new prefix", the others "repeated prefix"
    seen, expected = set(), []
    for p in prompts:
        expected.append("repeated prefix" if tuple(p[:prefix_len]) in seen else "new prefix")
        seen.add(tuple(p[:prefix_len]))
    assert [s[0].label for s in sessions] == expected


def test_prefix_repetition_refuses_more_prefixes_than_requests():
    with pytest.raises(ValueError, match="num_prefixes"):
        prefix_repetition_workload(2, 16, 4, 3, seed=0)


def test_multi_turn_conversations_grow_from_a_shared_system_prompt():
    common, own, turn, answer, turns = 40, 6, 11, 5, 3
    sessions = multi_turn_workload(4, turns, common, own, turn, answer, seed=2)
    assert len(sessions) == 4 and all(len(s) == turns for s in sessions)
    system = sessions[0][0].prompt[:common]
    for conversation in sessions:
        assert [t.label for t in conversation] == [f"turn {i + 1}" for i in range(turns)]
        for t, current in enumerate(conversation):
            # system + own + t * (user turn + answer) + the new user turn
            assert len(current.prompt) == common + own + t * (turn + answer) + turn
            assert current.prompt[:common] == system
            if t:  # the whole previous turn is the start of this one
                previous = conversation[t - 1].prompt
                assert current.prompt[:len(previous)] == previous
    # nothing but the system prompt is shared between conversations
    assert len({tuple(s[0].prompt[common:common + own]) for s in sessions}) == 4


def test_multi_turn_without_own_prefix_differs_right_after_the_system_prompt():
    sessions = multi_turn_workload(3, 1, 16, 0, 8, 4, seed=0)
    assert len({tuple(s[0].prompt[:16]) for s in sessions}) == 1
    assert len({tuple(s[0].prompt[16:]) for s in sessions}) == 3
