import os
import pickle

import numpy as np
import pytest

from hf_vrl.data import offline
from hf_vrl.data.schema import validate_row

FASHION_PRESENT = (offline.FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file()
needs_fashion = pytest.mark.skipif(not FASHION_PRESENT, reason="apt-get install dataset-fashion-mnist")


@needs_fashion
def test_fashion_mnist_official_split_sizes_and_names():
    images, labels = offline.fashion_mnist_arrays("train")
    assert images.shape == (60000, 28, 28) and labels.shape == (60000,)
    assert np.bincount(labels).tolist() == [6000] * 10
    test = offline.load_fashion_mnist("test")
    assert len(test) == 10000
    assert test.features["label"].names == list(offline.FASHION_MNIST_CLASSES)
    row = test[0]
    validate_row(row)
    assert row["image"].size == (32, 32)
    assert test.features["label"].names[row["label"]] in row["caption"]
    assert row["label"] == 9  # the first t10k image is an ankle boot


@needs_fashion
def test_fashion_mnist_train_loads_all_rows_with_limit_and_native_size():
    full = offline.load_fashion_mnist("train", image_size=None)
    assert len(full) == 60000 and full[0]["image"].size == (28, 28)
    small = offline.load_fashion_mnist("train", limit=50, seed=1)
    assert (
        len(small) == 50
        and small["caption"] == offline.load_fashion_mnist("train", limit=50, seed=1)["caption"]
    )


def test_missing_fashion_mnist_says_how_to_install(tmp_path):
    with pytest.raises(offline.DatasetUnavailableError, match="apt-get install dataset-fashion-mnist"):
        offline.load_fashion_mnist("test", root=tmp_path)


def _write_idx(path, array, magic_type=0x08):
    """An idx file as Fashion-MNIST ships it (big-endian dims after a 4-byte magic), gzipped."""
    import gzip
    import struct

    header = struct.pack(">HBB", 0, magic_type, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_fashion_mnist_folder_from_the_environment(tmp_path):
    """HF_VRL_FASHION_MNIST names the folder where no root-installed Debian package exists."""
    import subprocess
    import sys

    images = np.random.default_rng(0).integers(0, 256, (6, 28, 28))
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(6) % 10)
    code = "from hf_vrl.data import offline; print(len(offline.load_fashion_mnist('test')))"
    env = {**os.environ, "HF_VRL_FASHION_MNIST": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "6"


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo should-not-run",))


def test_numpy_only_unpickler_refuses_code_and_loads_arrays():
    with pytest.raises(pickle.UnpicklingError, match="only numpy arrays"):
        offline.load_numpy_pickle(pickle.dumps(_Exploit()))
    array = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert np.array_equal(offline.load_numpy_pickle(pickle.dumps(array, protocol=4)), array)
    with pytest.raises(pickle.UnpicklingError):
        offline.load_numpy_pickle(pickle.dumps({"not": "an array"}))


def test_animal_mnist_loads_with_the_restricted_unpickler(monkeypatch):
    pytest.importorskip("animal_mnist.data")

    def forbidden(*args, **kwargs):
        raise AssertionError("blind pickle load used")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    images, labels = offline.animal_mnist_arrays()
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [1000] * 10
    train, test = offline.load_animal_mnist("train"), offline.load_animal_mnist("test")
    assert (len(train), len(test)) == (8000, 2000)
    assert test.features["label"].names == list(offline.ANIMAL_MNIST_CLASSES)
    assert np.bincount(test["label"]).tolist() == [200] * 10
    validate_row(test[0])


def test_missing_animal_mnist_says_how_to_install(monkeypatch):
    monkeypatch.setattr(offline.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(offline.DatasetUnavailableError, match="pip install --no-deps animal-mnist"):
        offline.load_animal_mnist()


def test_digits_fixed_stratified_split():
    train, test = offline.load_digits("train"), offline.load_digits("test")
    assert len(train) + len(test) == 1797 and 350 <= len(test) <= 370
    assert test.features["label"].names[test[0]["label"]] in test[0]["caption"]
    assert train.features["label"].names == list(offline.DIGITS_CLASSES)
    assert offline.load_digits("test", seed=5)["label"] == test["label"]  # the split ignores the seed
    assert offline.load_digits("test", seed=5)["caption"] != test["caption"]  # the captions do not


def test_stratified_split_is_disjoint_and_covers_everything():
    labels = np.repeat(np.arange(4), 25)
    train, test = offline.stratified_split(labels, "train"), offline.stratified_split(labels, "test")
    assert not set(train) & set(test) and len(train) + len(test) == 100
    assert np.bincount(labels[test]).tolist() == [5] * 4


def test_fallback_picks_the_first_available(monkeypatch, tmp_path):
    def missing(*args, **kwargs):
        raise offline.DatasetUnavailableError("not here")

    monkeypatch.setitem(offline.OFFLINE_LOADERS, "fashion_mnist", missing)
    monkeypatch.setitem(offline.OFFLINE_LOADERS, "animal_mnist", missing)
    name, ds = offline.load_first_available("test", limit=10)
    assert name == "digits" and len(ds) == 10
    monkeypatch.setitem(offline.OFFLINE_LOADERS, "digits", missing)
    with pytest.raises(offline.DatasetUnavailableError, match="fashion_mnist: not here"):
        offline.load_first_available("test")


def test_bad_split_is_rejected():
    with pytest.raises(ValueError, match="split must be one of"):
        offline.load_digits("validation")
