"""benchmarks/rate_bound_out_of_sample.py's rule on made-up rates: a set is held to three times the fastest
closed set of its class in the rounds before it (of any class where its class is new there); sets of its own
round and open-division sets never form the bound. (The run over every published round is its record.)"""

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from rate_bound_out_of_sample import SetRate, judged_lines  # noqa: E402


def rate(set_id: str, value: float, cls: str = "A100", division: str = "closed") -> SetRate:
    return SetRate(set_id, value, cls, f"an {cls}", division)


def line_of(lines: list[str], set_id: str) -> str:
    (line,) = [x for x in lines if x.startswith(set_id + " (")]
    return line


def test_each_round_meets_the_bound_of_the_closed_sets_before_it_only():
    rounds = [
        [rate("v1/a", 100.0), rate("v1/open-fast", 900.0, division="open")],  # open: never the ground
        [rate("v2/b", 290.0), rate("v2/c", 310.0)],  # 2.9 and 3.1 x v1/a; b is not held to c, its round's
        [rate("v3/d", 320.0), rate("v3/new", 800.0, cls="H100")],  # the class's fastest is now c (310)
    ]
    lines = judged_lines(rounds)
    assert lines[0] == ("4 sets held to the bound of the rounds before them (2 of the first round have none): 3 within "
                        "3 x, 1 beyond: v2/c (3.10 x)")
    assert "no earlier round, no bound" in line_of(lines, "v1/open-fast")
    assert line_of(lines, "v2/b").endswith("= 2.90 x the fastest earlier of its class (100.0, v1/a): within 3 x")
    assert line_of(lines, "v3/d").endswith("= 1.03 x the fastest earlier of its class (310.0, v2/c): within 3 x")
    assert line_of(lines, "v3/new").endswith(
        "= 2.58 x the fastest earlier of any class (its class is new) (310.0, v2/c): within 3 x")
    assert "by its class: 3 sets; the highest ratio 3.10 (v2/c, 310.0 against v1/a, 100.0)" in lines
    assert "by any class (its class is new): 1 sets; the highest ratio 2.58 (v3/new, 800.0 against v2/c, 310.0)" in lines
