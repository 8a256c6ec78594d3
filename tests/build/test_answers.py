"""Answers compared by what they say (toolrl.build.answers): the forms a real multi-hop set writes one fact in are
one fact; true conflicts stay conflicts and are listed with both values."""

import pytest

from toolrl.build.answers import canonical, contains, fact_conflicts, number, same_answer

SAME = [
    ("8848.86", "8,848.86 m"),  # FanOutQA: Mount Everest's height in two tasks
    ("Anthony Russo and Joe Russo", "Anthony Russo, Joe Russo"),
    ("Steve Jobs & Steve Wozniak", "Steve Wozniak and Steve Jobs"),  # the order and the joiner
    ("India, China, United States", "China; India; United States"),
    ("83.7 million", "83,700,000"),
    ("Left", "left."),
    ("Apple Inc.", "apple inc"),
    ("1,000", "1000"),
    ("$2.5 billion", "2,500,000,000 USD"),
    ("The Beatles", "Beatles"),
]
DIFFERENT = [
    ("Anthony Russo and Joe Russo", "The Russo brothers"),  # the same people, not the same words: a true conflict
    ("Tokyo, Delhi, Mumbai", "Tokyo, Delhi, Mexico City"),
    ("83.7 million", "84482267"),
    ("8848 m", "8848 ft"),
    ("1", "2"),
    ("2010", "2011"),
    ("GDP", "GDP per capita"),
    ("-5", "5"),
    ("-12.5 m", "12.5 m"),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_forms_of_one_answer_are_the_same(a, b):
    assert same_answer(a, b) and same_answer(b, a)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_answers_stay_different(a, b):
    assert not same_answer(a, b) and not same_answer(b, a)


def test_numbers_lists_and_replies():
    assert number("8,848.86 m") == number("8848.86 m") and number("83.7 million").value == 83_700_000
    assert number("Oslo") is None and number("1999-01-02") is None
    assert canonical("Joe Russo and Anthony Russo") == canonical("Anthony Russo, Joe Russo")
    assert contains("The height is 8848.86 metres.", "8,848.86 m")
    assert contains("It stands 8,848.86 m tall", "8848.86")
    assert contains("They are Joe Russo and Anthony Russo", "Anthony Russo, Joe Russo")
    assert not contains("about 84 million people", "84482267") and not contains("Mumbai", "Mexico City")
    assert not contains("18848.86", "8848.86")


def test_true_conflicts_are_listed_with_both_values_and_their_sources():
    rows = [
        ("height", "k", "8848.86", "t1/a"),
        ("height", "k", "8,848.86 m", "t2/a"),  # the same fact
        ("directed", "e", "Anthony Russo and Joe Russo", "t3/b"),
        ("directed", "e", "The Russo brothers", "t4/b"),
        ("directed", "e", "Joe Russo & Anthony Russo", "t5/b"),
    ]
    assert fact_conflicts(rows) == [
        {
            "kind": "directed",
            "key": "e",
            "values": [
                {"answer": "Anthony Russo and Joe Russo", "from": "t3/b"},
                {"answer": "The Russo brothers", "from": "t4/b"},
            ],
        }
    ]
