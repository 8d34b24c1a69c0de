"""examples/train_ctr.py (the README's first command), run tiny: it must learn, keep the
table sizes honest, restore a checkpoint exactly and serve the same scores from a fresh
TensorFlow-only process."""
import numpy as np
import pytest

from tests.examples import load_example

pytest.importorskip("tensorflow")

TINY = ["--rows", "4000", "--epochs", "1", "--vocab", "1000", "--batch-size", "64",
        "--learning-rate", "0.02"]


@pytest.fixture(scope="module")
def example():
    return load_example("train_ctr")


def test_tiny_run_learns_restores_and_serves(example, tmp_path, capsys):
    res = example.main(TINY + ["--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert res["auc_baseline"] == pytest.approx(0.5)
    assert res["auc_model"] > res["auc_baseline"] + 0.05, out
    assert res["auc_model"] < res["auc_oracle"] + 0.02          # the planted model bounds it
    assert res["restored_identical"], out
    assert res["served_match"] and res["served_max_abs_diff"] <= 1e-6, out
    assert all(n > 0 for n in res["table_sizes"])
    assert (tmp_path / "serving" / "saved_model.pb").is_file()
    assert list((tmp_path / "checkpoint").glob("ctr-1.index"))
    for text in ("AUC", "planted true model", "identical predictions: True",
                 "served == model.predict on 16 rows: True"):
        assert text in out


def test_data_ids_cover_int64_and_follow_zipf(example):
    ids, clicks, prob = example.make_data(20_000, 3, 500, seed=1)
    assert ids.shape == (20_000, 3) and ids.dtype.name == "int64"
    assert (ids < 0).any() and (ids > 0).any()                  # hashed over the whole range
    assert len({*ids[:, 0].tolist()} & {*ids[:, 1].tolist()}) == 0   # features do not collide
    _, counts = np.unique(ids[:, 0], return_counts=True)
    counts.sort()
    assert counts[-1] > 20 * counts[len(counts) // 2]           # a heavy head, a long tail
    assert 0.05 < clicks.mean() < 0.6 and ((prob > 0) & (prob < 1)).all()
    again = example.make_data(20_000, 3, 500, seed=1)
    assert (again[0] == ids).all() and (again[1] == clicks).all()


@pytest.mark.parametrize("bad", [["--rows", "0"], ["--dim", "-1"], ["--test-fraction", "1.5"]])
def test_bad_flags_exit_with_usage(example, bad, capsys):
    with pytest.raises(SystemExit):
        example.main(bad)
    assert "error" in capsys.readouterr().err
