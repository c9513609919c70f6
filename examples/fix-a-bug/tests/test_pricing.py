"""The shop's tests. One of them fails: `total` skips the first item of a basket.

Under `pytest --loop` the `loop` marker turns that failure into a fix-loop: run
`python fix_pricing.py` (the revise step), re-run the test in a fresh pytest
process, and stop when it passes or after 3 iterations.
"""

import pytest
from shop.pricing import apply_discount, total


def test_discount_takes_the_percentage_off():
    assert apply_discount(2000, 25) == 1500


def test_no_discount_keeps_the_price():
    assert apply_discount(999, 0) == 999


def test_a_discount_over_100_percent_is_refused():
    with pytest.raises(ValueError):
        apply_discount(100, 120)


@pytest.mark.loop(revise="python fix_pricing.py", max_iter=3, state="shop/*.py")
def test_total_of_a_basket():
    assert total([1000, 500, 250], percent=10) == 1575
