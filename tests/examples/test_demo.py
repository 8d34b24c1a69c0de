"""examples/demo.py (the tour of the table, numbaemb only), run small: each step must
show what it says (training moves the rows, the bound holds and evicts, the filter
holds ids back, expiry removes, the reload is the same table)."""
import pytest

from tests.examples import load_example


@pytest.fixture(scope="module")
def demo():
    return load_example("demo")


def test_small_tour_does_what_it_prints(demo, capsys):
    res = demo.main(["--batches", "6", "--batch", "5000", "--dim", "4"])
    out = capsys.readouterr().out
    assert abs(res["hot_after"] - 0.1) < abs(res["hot_before"] - 0.1) / 2, out
    assert res["absent_exists"] == [False, False]
    assert res["bounded_size"] == res["bounded_capacity"] and res["evicted"] > 0, out
    assert res["admitted"] == (0, 10)
    assert 0 < res["expired"] < res["size"], out
    assert res["reload_same"], out
    for text in ("1. Variable", "2. absent", "3. bounded", "4. expire", "5. saved"):
        assert text in out
