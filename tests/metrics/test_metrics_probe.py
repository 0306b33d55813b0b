import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from hf_vrl.metrics import few_shot_probe, linear_probe


def imbalanced_separable(n, seed):
    """70/30 classes separated along x0: a near-zero C can only predict the majority class."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(int)
    x = np.c_[np.where(y == 1, 1.0, -1.0) + 0.3 * rng.normal(size=n), rng.normal(size=n)]
    return x, y


def test_linear_probe_picks_the_C_that_validates_best_and_refits_on_full_train():
    xtr, ytr = imbalanced_separable(200, 0)
    xte, yte = imbalanced_separable(100, 1)
    res = linear_probe(xtr, ytr, xte, yte, Cs=(1e-6, 10.0), seed=0)
    assert res["C"] == 10.0
    assert res["val_accuracies"]["10"] > res["val_accuracies"]["1e-06"]
    refit = LogisticRegression(C=10.0, max_iter=1000).fit(xtr, ytr).score(xte, yte)
    collapsed = LogisticRegression(C=1e-6, max_iter=1000).fit(xtr, ytr).score(xte, yte)
    assert res["accuracy"] == pytest.approx(refit)
    assert res["accuracy"] > collapsed + 0.2
    assert res["n_train"] == 200 and 0 < res["n_val"] < 200


def test_linear_probe_breaks_ties_towards_the_smallest_C():
    xtr, ytr = imbalanced_separable(200, 3)
    xtr[:, 0] = np.where(ytr == 1, 2.0, -2.0)  # every C >= 1 separates the validation split perfectly
    res = linear_probe(xtr, ytr, xtr, ytr, Cs=(100.0, 1e-6, 1.0, 10.0), seed=0)
    assert res["val_accuracies"]["1"] == res["val_accuracies"]["100"] == 1.0
    assert res["val_accuracies"]["1e-06"] < 1.0
    assert res["C"] == 1.0 and res["val_accuracy"] == 1.0


def test_linear_probe_validation_split_is_stratified():
    x = np.random.default_rng(0).normal(size=(23, 3))
    y = np.array([0] * 10 + [1] * 10 + [2] * 2 + [3])
    res = linear_probe(x, y, x, y, Cs=(0.1, 1.0), val_fraction=0.2)
    # per class round(0.2 n) (>= 1 when n >= 2), single-sample classes stay in train: 2 + 2 + 1 + 0
    assert res["n_val"] == 5


def test_linear_probe_single_C_skips_validation():
    x, y = imbalanced_separable(50, 2)
    res = linear_probe(x, y, x, y, Cs=(1.0,))
    assert res["C"] == 1.0 and res["n_val"] == 0 and res["val_accuracy"] is None
    assert res["accuracy"] == pytest.approx(LogisticRegression(C=1.0, max_iter=1000).fit(x, y).score(x, y))


def test_linear_probe_errors():
    x = np.zeros((4, 2))
    with pytest.raises(ValueError, match="two classes"):
        linear_probe(x, [0, 0, 0, 0], x, [0, 0, 0, 0])
    with pytest.raises(ValueError, match="dim"):
        linear_probe(x, [0, 1, 0, 1], np.zeros((2, 3)), [0, 1])
    with pytest.raises(ValueError, match="single C"):
        linear_probe(x, [0, 1, 2, 3], x, [0, 1, 2, 3], Cs=(0.1, 1.0))


def test_few_shot_probe_episodes():
    xtr, ytr = imbalanced_separable(100, 4)
    xte, yte = imbalanced_separable(60, 5)
    res = few_shot_probe(xtr, ytr, xte, yte, k=4, n_episodes=3, seed=0, Cs=(1e-3, 1.0, 100.0))
    assert res["k"] == 4 and res["n_episodes"] == 3 and len(res["accuracies"]) == 3
    assert res["accuracy_mean"] == pytest.approx(np.mean(res["accuracies"]))
    assert res["accuracy_std"] == pytest.approx(np.std(res["accuracies"]))
    assert res["accuracy_mean"] > 0.8
    again = few_shot_probe(xtr, ytr, xte, yte, k=4, n_episodes=3, seed=0, Cs=(1e-3, 1.0, 100.0))
    assert again == res


def test_few_shot_probe_one_shot_needs_a_single_C():
    xtr, ytr = imbalanced_separable(40, 6)
    with pytest.raises(ValueError, match="single C"):
        few_shot_probe(xtr, ytr, xtr, ytr, k=1, n_episodes=1)
    res = few_shot_probe(xtr, ytr, xtr, ytr, k=1, n_episodes=2, Cs=(1.0,))
    assert res["Cs"] == [1.0, 1.0]
    with pytest.raises(ValueError, match="fewer than k"):
        few_shot_probe(xtr, ytr, xtr, ytr, k=1000, n_episodes=1, Cs=(1.0,))


def test_convergence_warnings_become_one_summary_line(caplog, recwarn):
    """Fits stopped by max_iter are counted and logged once, not printed as one warning per fit."""
    import logging

    xtr, ytr = imbalanced_separable(200, 0)
    with caplog.at_level(logging.WARNING, logger="hf_vrl.metrics.probe"):
        res = linear_probe(xtr, ytr, xtr, ytr, Cs=(1e-2, 1.0, 1e3), max_iter=1, seed=0)
    assert res["n_not_converged"] >= 3  # the sweep's fits and the refit each stop after one iteration
    assert not [w for w in recwarn if "converge" in str(w.message).lower()]
    summaries = [r for r in caplog.records if "before converging" in r.getMessage()]
    assert len(summaries) == 1 and f"{res['n_not_converged']} of 4" in summaries[0].getMessage()
    assert linear_probe(xtr, ytr, xtr, ytr, Cs=(1.0,))["n_not_converged"] == 0


def test_probe_fits_run_on_one_thread_by_default(monkeypatch):
    """BLAS and OpenMP are limited to one thread during the fits (threads=None leaves the defaults)."""
    from threadpoolctl import threadpool_info

    seen = []
    real_fit = LogisticRegression.fit

    def fit(self, *args, **kwargs):
        seen.append({pool["user_api"]: pool["num_threads"] for pool in threadpool_info()})
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(LogisticRegression, "fit", fit)
    xtr, ytr = imbalanced_separable(60, 0)
    linear_probe(xtr, ytr, xtr, ytr, Cs=(0.1, 1.0))
    assert len(seen) == 3 and all(set(threads.values()) == {1} for threads in seen), seen
    seen.clear()
    linear_probe(xtr, ytr, xtr, ytr, Cs=(1.0,), threads=None)
    assert seen == [{pool["user_api"]: pool["num_threads"] for pool in threadpool_info()}]
