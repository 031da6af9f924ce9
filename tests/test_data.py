"""Lab data: bundled digits and text, user text files and CIFAR binary batches."""

import os

import numpy as np
import pytest

from spectral_optax import lab
from spectral_optax.lab import DataError


def test_digits_split_and_standardization():
    d = lab.digits()
    x, y = d.train
    xv, yv = d.val
    assert x.shape == (1500, 64) and xv.shape == (297, 64) and d.num_outputs == 10
    assert set(np.unique(y)) == set(range(10))
    np.testing.assert_allclose(x.mean(0), 0, atol=1e-5)
    stds = x.std(0)
    assert np.all((np.abs(stds - 1) < 1e-4) | (stds < 1e-6))
    d2 = lab.digits()  # fixed split
    np.testing.assert_array_equal(d2.val[1], yv)
    # every original image appears exactly once across the split
    from sklearn.datasets import load_digits

    assert len(x) + len(xv) == len(load_digits().data)


def test_digits_binary_targets():
    d = lab.digits_binary((3, 8), num_train=200)
    x, y = d.train
    assert x.shape == (200, 64) and d.kind == "regression"
    assert set(np.unique(y)) == {-1.0, 1.0} and (y > 0).sum() == 100
    assert d.num_val > 100 and d.val[0].shape[1] == 64


def test_embedded_text_windows():
    d = lab.text(context=8)
    (tr,), (va,) = d.train, d.val
    assert len(tr) + len(va) > 400_000 and d.num_outputs == 256 and d.kind == "bytes"
    assert abs(len(va) / (len(tr) + len(va)) - 0.1) < 1e-3
    from pydoc_data import topics

    first = topics.topics[sorted(topics.topics)[0]].encode("utf-8")
    assert bytes(tr[:200]) == first[:200]  # real English from the bundled docs
    idx = np.array([0, 5, d.num_train - 1])
    x, y = d.batch(d.train, idx)
    for k, i in enumerate(idx):
        np.testing.assert_array_equal(np.asarray(x[k]), tr[i : i + 8])
        assert int(y[k]) == tr[i + 8]
    xn, yn = d.numpy_batch("val", [d.num_val - 1])
    np.testing.assert_array_equal(xn[0], va[-9:-1])
    assert yn[0] == va[-1]


def test_text_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("héllo wörld, " * 50, encoding="utf-8")
    d = lab.text(p, context=4, val_fraction=0.2)
    raw = p.read_bytes()
    cut = int(len(raw) * 0.8)
    np.testing.assert_array_equal(d.train[0], np.frombuffer(raw[:cut], np.uint8))
    assert d.num_train == cut - 4 and d.name == "text:t.txt"


@pytest.mark.parametrize(
    "content, match",
    [(b"abc\xff\xfedef" * 20, "not valid UTF-8"), (b"short", "too short"), (b"a\x00b" * 40, "NUL")],
)
def test_bad_text_files(tmp_path, content, match):
    p = tmp_path / "bad.txt"
    p.write_bytes(content)
    with pytest.raises(DataError, match=match) as e:
        lab.text(p, context=8)
    assert str(p) in str(e.value) and "UTF-8 text file" in str(e.value)


def test_missing_text_file_and_directory(tmp_path):
    with pytest.raises(DataError, match="not found") as e:
        lab.text(tmp_path / "nope.txt")
    assert "nope.txt" in str(e.value)
    with pytest.raises(DataError, match="directory"):
        lab.text(tmp_path)


def _cifar_records(labels, rng, label_bytes=1, fine=None):
    recs = []
    for i, lab_ in enumerate(labels):
        head = [lab_] if label_bytes == 1 else [lab_, fine[i]]
        img = rng.integers(0, 256, 3072, dtype=np.uint8)
        recs.append(np.concatenate([np.array(head, np.uint8), img]))
    return np.stack(recs)


def _write_cifar10(root, rng):
    os.makedirs(root, exist_ok=True)
    all_train = []
    for b in range(1, 6):
        r = _cifar_records([b % 10, (b + 3) % 10], rng)
        r.tofile(os.path.join(root, f"data_batch_{b}.bin"))
        all_train.append(r)
    test = _cifar_records([7, 9, 0], rng)
    test.tofile(os.path.join(root, "test_batch.bin"))
    return np.concatenate(all_train), test


def test_cifar10_binary(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "cifar-10-batches-bin"  # found as a subdirectory
    train, test = _write_cifar10(str(root), rng)
    d = lab.cifar(tmp_path, num_classes=10)
    x, y = d.train
    assert x.shape == (10, 32, 32, 3) and d.num_val == 3
    np.testing.assert_array_equal(y, train[:, 0])
    np.testing.assert_array_equal(d.val[1], [7, 9, 0])
    # layout: record bytes are channel-major (R plane, G plane, B plane), rows of 32
    raw = train[:, 1:].reshape(10, 3, 32, 32).astype(np.float64) / 255.0
    mean = raw.mean(axis=(0, 2, 3))
    std = raw.std(axis=(0, 2, 3))
    expect = (raw.transpose(0, 2, 3, 1) - mean) / std
    np.testing.assert_allclose(x, expect, rtol=1e-4, atol=1e-4)
    flat = lab.cifar(root, num_classes=10, flatten=True)
    assert flat.input_shape == (3072,) and flat.train[0].shape == (10, 3072)


def test_cifar100_binary_fine_and_coarse(tmp_path):
    rng = np.random.default_rng(1)
    tr = _cifar_records([1, 19], rng, 2, fine=[55, 99])
    te = _cifar_records([4], rng, 2, fine=[42])
    tr.tofile(tmp_path / "train.bin")
    te.tofile(tmp_path / "test.bin")
    d = lab.cifar(tmp_path, num_classes=100)
    np.testing.assert_array_equal(d.train[1], [55, 99])
    assert d.num_outputs == 100
    c = lab.cifar(tmp_path, num_classes=100, coarse=True)
    np.testing.assert_array_equal(c.train[1], [1, 19])
    assert c.num_outputs == 20


def test_cifar_bad_files(tmp_path):
    rng = np.random.default_rng(2)
    _write_cifar10(str(tmp_path), rng)
    bad = tmp_path / "data_batch_3.bin"
    bad.write_bytes(bad.read_bytes()[:-10])  # truncated
    with pytest.raises(DataError, match="3073") as e:
        lab.cifar(tmp_path)
    assert "data_batch_3.bin" in str(e.value) and "CIFAR-10 binary format" in str(e.value)
    os.remove(bad)
    with pytest.raises(DataError, match="not found") as e:
        lab.cifar(tmp_path)
    assert "data_batch_3.bin" in str(e.value)
    _cifar_records([12], rng).tofile(bad)  # label 12 >= 10
    with pytest.raises(DataError, match="label 12"):
        lab.cifar(tmp_path)
    with pytest.raises(DataError, match="directory"):
        lab.cifar(tmp_path / "missing")
    # a pickled python batch is not accepted (and never unpickled)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "train.bin").write_bytes(b"\x80\x04\x95" + b"x" * 100)
    (tmp_path / "p" / "test.bin").write_bytes(b"")
    with pytest.raises(DataError, match="3074"):
        lab.cifar(tmp_path / "p", num_classes=100)


def test_load_specs(tmp_path):
    assert lab.load("digits").name == "digits"
    assert lab.load("text", context=4).context == 4
    with pytest.raises(DataError, match="unknown data spec"):
        lab.load("mnist")
    with pytest.raises(DataError, match="give the directory"):
        lab.load("cifar10")


def _write_cifar10_ms_lab(root):
    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)

    def recs(labels):
        return np.stack([np.concatenate([[lab_], rng.integers(0, 256, 3072)]).astype(np.uint8) for lab_ in labels])

    for b in range(1, 6):
        recs([b % 10, (b + 3) % 10]).tofile(os.path.join(root, f"data_batch_{b}.bin"))
    recs([7, 9, 0]).tofile(os.path.join(root, "test_batch.bin"))


def test_text_too_short_errors_name_the_source_and_needed_size(tmp_path):
    """The too-short error names the file (or 'the embedded text') and the bytes needed, 2 (T + 1) / min(f, 1-f) + 1."""
    p = tmp_path / "short.txt"
    p.write_bytes(b"0123456789")
    with pytest.raises(lab.DataError, match=r"short\.txt' has 10 bytes.*at least 181 bytes"):
        lab.text(str(p), context=8, val_fraction=0.1)
    with pytest.raises(lab.DataError, match=r"text: the embedded text has \d+ bytes, too short for context=100000"):
        lab.text(context=100000)


def test_text_dataset_name_says_seq_for_sequence(tmp_path):
    """text(sequence=True) is named 'seq:<file>', text() 'text:<file>'."""
    p = tmp_path / "long.txt"
    p.write_bytes(bytes(range(32, 127)) * 4)
    assert lab.text(str(p), context=4, sequence=True).name == "seq:long.txt"
    assert lab.text(str(p), context=4).name == "text:long.txt"


def test_load_cifar10_spec_gives_ten_classes_flattened_by_default(tmp_path):
    """load('cifar10:DIR') reads 10 classes with flat (3072,) inputs by default, (32, 32, 3) with flatten=False."""
    _write_cifar10_ms_lab(str(tmp_path))
    ds = lab.load(f"cifar10:{tmp_path}")
    assert ds.num_outputs == 10 and ds.input_shape == (3072,) and ds.num_train == 10 and ds.num_val == 3
    assert lab.load(f"cifar10:{tmp_path}", flatten=False).input_shape == (32, 32, 3)
