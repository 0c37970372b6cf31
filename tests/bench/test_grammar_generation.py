from bench.grammar_generation import LOOP_WINDOW, loop_period


def test_a_cycling_answer_has_the_period_of_its_cycle():
    text = '{"a": ' + '"type": "object", ' * 40
    assert loop_period(text) == len('"type": "object", ')


def test_an_answer_that_still_moves_is_not_a_loop():
    counting = ", ".join(str(i) for i in range(200))  # degenerate, but not periodic
    assert loop_period(counting) is None
    assert loop_period("x" * (LOOP_WINDOW - 1)) is None  # too short to judge


def test_a_cycle_longer_than_the_longest_period_is_not_reported():
    block = "".join(chr(ord("a") + i % 26) + str(i) for i in range(80))  # a 230-character period
    assert loop_period(block * 3) is None
