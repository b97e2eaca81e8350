"""bench/arithmetic.py: the graded arithmetic source, by hand — the levels' shapes and answers,
level specs, distinct texts, determinism in the seed, an exhausted level leaving its turn, and
the source through bench/problems.py (ids hash the text; golds math-verify grades)."""

import random
import re

import pytest

from bench.arithmetic import arithmetic_rows, item, parse_levels
from bench.errors import SourceError
from bench.problem_ids import problem_id
from bench.problems import SourceSpec, load_problems


def test_level_specs():
    assert parse_levels("") == (1, 2, 3, 4, 5)
    assert parse_levels("2") == (2,)
    assert parse_levels("1-3") == (1, 2, 3)
    assert parse_levels("4,2,4") == (4, 2)
    for bad in ("0", "6", "a", "1-", "3-9"):
        with pytest.raises(SourceError, match="levels are 1-5"):
            parse_levels(bad)


@pytest.mark.parametrize("level, pattern", [
    (1, r"What is ([1-9]) \+ ([1-9])\?"),
    (2, r"What is ([2-9]) ([-*]) ([1-9])\?"),
    (3, r"What is ([1-9]\d) ([-+]) ([1-9])\?"),
    (4, r"What is ([1-9]\d) ([-+]) ([1-9]\d)\?"),
])
def test_each_level_has_its_shape_and_the_right_answer(level, pattern):
    rng = random.Random(7)
    for _ in range(200):
        text, answer = item(level, rng)
        m = re.fullmatch(pattern, text)
        assert m, text
        a, *rest = m.groups()
        b, op = int(rest[-1]), (rest[0] if len(rest) == 2 else "+")
        assert answer == {"+": int(a) + b, "-": int(a) - b, "*": int(a) * b}[op] and answer >= 0, text


def test_word_problems_by_hand():
    rng = random.Random(3)
    for _ in range(100):
        text, answer = item(5, rng)
        nums = [int(x) for x in re.findall(r"\d+", text)]
        assert len(nums) == 2
        assert answer == (nums[0] + nums[1] if "more" in text else nums[0] - nums[1]) and answer >= 0, text


def test_rows_take_the_levels_in_turn_once_each_and_follow_the_seed():
    rows = arithmetic_rows("", 10, seed=0)
    assert [r["level"] for r in rows] == [1, 2, 3, 4, 5] * 2
    assert arithmetic_rows("", 10, seed=0) == rows and arithmetic_rows("", 10, seed=1) != rows
    many = arithmetic_rows("1-2", 150, seed=0)
    assert len({r["problem"] for r in many}) == 150
    # level 1 has 81 distinct sums: past them the other levels take its turns
    ones = arithmetic_rows("1,3", 300, seed=0)
    assert sum(r["level"] == 1 for r in ones) == 81 and len(ones) == 300
    with pytest.raises(SourceError, match="has 81 distinct problems, fewer than 100"):
        arithmetic_rows("1", 100)


def test_the_source_through_load_problems():
    probs = load_problems(SourceSpec("arithmetic:2", limit=5, seed=4))
    assert len(probs) == 5 and all(p.id == problem_id(p.problem) for p in probs)
    assert [p.answer for p in probs] == [r["answer"] for r in arithmetic_rows("2", 5, seed=4)]
    with pytest.raises(SourceError, match="unknown source"):
        load_problems(SourceSpec("arithmetics"))
