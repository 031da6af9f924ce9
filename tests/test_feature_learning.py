"""The feature-learning task's data (``lab.binary_pair``: the CIFAR-10 pair from a local directory, synthetic binary
files) and ``benchmarks.feature_learning``'s command line on it."""

import json

import numpy as np
import pytest

RECORD = 1 + 3072


def write_cifar10(directory, per_file=6):
    """Tiny CIFAR-10 binary batches: labels cycle 0, 1, 2; class 0 images are all 0, class 1 all 255,
    class 2 all 128 (so after per-channel standardization class 0 is negative and class 1 positive)."""
    fill = {0: 0, 1: 255, 2: 128}
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    for name in names:
        recs = []
        for r in range(per_file):
            label = r % 3
            recs.append(np.concatenate([[label], np.full(3072, fill[label])]).astype(np.uint8))
        np.concatenate(recs).tofile(directory / name)


def test_binary_pair_reads_the_cifar_pair(tmp_path):
    from spectral_optax import lab

    write_cifar10(tmp_path)
    pair = lab.binary_pair(f"cifar10:{tmp_path}", (0, 1), num_train=8)
    (x, y), (xv, yv) = pair.train, pair.val
    assert x.shape == (8, 3072) and pair.name == "cifar10_0v1" and pair.kind == "regression"
    assert (pair.num_train, pair.num_val, pair.num_outputs, pair.input_shape) == (8, 4, 1, (3072,))
    assert sorted(y.tolist()) == [-1.0] * 4 + [1.0] * 4  # balanced, airplane -> -1, automobile -> +1
    np.testing.assert_array_equal(np.sign(x.mean(1)), y)  # each example is from its class
    # the validation set: every test-batch image of the two classes (labels 0, 1, 2 cycle over its 6 records)
    assert sorted(yv.tolist()) == [-1.0] * 2 + [1.0] * 2
    np.testing.assert_array_equal(np.sign(xv.mean(1)), yv)
    # a different split seed draws different examples, the same balance
    other = lab.binary_pair(f"cifar10:{tmp_path}", (0, 1), num_train=8, split_seed=1)
    assert sorted(other.train[1].tolist()) == sorted(y.tolist())
    with pytest.raises(ValueError, match="num_train=40"):
        lab.binary_pair(f"cifar10:{tmp_path}", (0, 1), num_train=40)


@pytest.mark.slow
def test_feature_learning_runs_on_cifar_dir(tmp_path):
    from benchmarks import feature_learning as fl

    data = tmp_path / "cifar"
    data.mkdir()
    write_cifar10(data)
    path = tmp_path / "fl.json"
    fl.main(
        [
            "--data",
            f"cifar10:{data}",
            "--num-train",
            "8",
            "--steps",
            "5",
            "--widths",
            "64,128",
            "--seeds",
            "2",
            "--json",
            str(path),
            "--out",
            str(tmp_path),
        ]
    )
    res = json.loads(path.read_text())
    assert res["d0"] == 3072 and res["data"] == "cifar10_0v1" and res["seeds"] == 2
    for p in ("muP", "NTP"):
        assert len(res["results"][p]["slopes_per_seed"]["feature_change"]) == 2
        assert all(np.isfinite(res["results"][p]["final_loss"]))
    assert (tmp_path / "feature_learning.png").stat().st_size > 1000
