"""Linear probe with the L2 strength chosen on a held-out validation split (CLIP, Radford et al. 2021,
App. A.3), and a k-shot variant averaged over episodes.

Fits that stop at `max_iter` before converging (scikit-learn's ConvergenceWarning, common at large C) are
counted, not printed one by one: the result's `n_not_converged` and one logged line per probe.

The fits run on one thread by default (`threads=1`, BLAS and OpenMP through threadpoolctl): an L-BFGS step on
probe-sized data is too small to gain from threads, and on a busy 2-core machine OpenMP's spin-waiting made a
10,000-sample probe of 64-d features run for over 15 minutes instead of 27 s (benchmarks/linear_probe.py)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from hf_vrl.errors import UserError
from hf_vrl.metrics._common import as_labels, as_matrix

logger = logging.getLogger(__name__)


class TooFewSamplesError(UserError, ValueError):
    """Too few training samples per class to carve the validation split that chooses C: one line, with what
    to do (give one C, or more samples)."""


# scikit-learn's C is the inverse L2 strength 1/lambda; CLIP sweeps lambda over [1e-6, 1e6] (log-spaced).
DEFAULT_CS: tuple[float, ...] = tuple(float(c) for c in np.logspace(-6, 6, 13))


def _stratified_split(y: np.ndarray, val_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Per class, hold out round(val_fraction * n_c) samples (at least 1) when the class has >= 2 samples."""
    train, val = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val = max(1, round(val_fraction * idx.size)) if idx.size >= 2 else 0
        n_val = min(n_val, idx.size - 1)
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


@contextmanager
def _thread_limit(threads: int | None) -> Iterator[None]:
    """Limit BLAS and OpenMP to `threads` inside the block (no limit for None)."""
    if threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads):
        yield


@contextmanager
def _convergence_warnings() -> Iterator[list[Any]]:
    """Collect scikit-learn's ConvergenceWarnings (instead of printing them) into the yielded list."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        collected: list[Any] = []
        yield collected
        collected.extend(w for w in caught if issubclass(w.category, ConvergenceWarning))
    for w in caught:
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _fit_score(
    x: np.ndarray, y: np.ndarray, x_eval: np.ndarray, y_eval: np.ndarray, C: float, max_iter: int
) -> float:
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(C=C, max_iter=max_iter)
    return float(clf.fit(x, y).score(x_eval, y_eval))


def _sweep(
    x: np.ndarray, y: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, cs: list[float], max_iter: int
) -> dict[str, float]:
    """Validation accuracy along the C path, ascending, each fit warm-started from the previous one."""
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=max_iter, warm_start=True)
    return {f"{c:g}": float(clf.set_params(C=c).fit(x, y).score(x_val, y_val)) for c in cs}


def linear_probe(
    train_x: Any,
    train_y: Any,
    test_x: Any,
    test_y: Any,
    *,
    val_fraction: float = 0.2,
    Cs: Sequence[float] = DEFAULT_CS,
    seed: int = 0,
    max_iter: int = 1000,
    threads: int | None = 1,
) -> dict[str, Any]:
    """Logistic-regression probe: sweep `Cs` on a stratified validation split carved from train, keep the
    best (ties: the smallest C, i.e. the strongest regularisation), refit on the full train set, score test.
    The fits use `threads` BLAS / OpenMP threads (None: the libraries' default; module docstring).

    Returns {"accuracy", "C", "val_accuracy", "val_accuracies" ({C: acc}), "n_train", "n_val",
    "n_not_converged" (fits that hit `max_iter`, logged as one warning)}.
    """
    xtr, xte = as_matrix(train_x, name="train_x"), as_matrix(test_x, name="test_x")
    ytr = as_labels(train_y, n=xtr.shape[0], name="train_y")
    yte = as_labels(test_y, n=xte.shape[0], name="test_y")
    if xtr.shape[1] != xte.shape[1]:
        raise ValueError(f"train features have dim {xtr.shape[1]}, test features {xte.shape[1]}")
    if np.unique(ytr).size < 2:
        raise ValueError("linear_probe needs at least two classes in the training labels")
    if not Cs:
        raise ValueError("Cs must hold at least one regularisation value")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    cs = sorted(float(c) for c in Cs)
    val_scores: dict[str, float] = {}
    n_val = 0
    with _convergence_warnings() as not_converged, _thread_limit(threads):
        if len(cs) > 1:
            fit_idx, val_idx = _stratified_split(ytr, val_fraction, np.random.default_rng(seed))
            n_val = int(val_idx.size)
            if n_val == 0 or np.unique(ytr[fit_idx]).size < 2:
                smallest = int(np.bincount(np.unique(ytr, return_inverse=True)[1]).min())
                raise TooFewSamplesError(
                    f"linear probe: {xtr.shape[0]} training samples in {np.unique(ytr).size} classes (the "
                    f"smallest has {smallest}) are too few to carve a validation split that chooses C: give "
                    "a single C (hf-vrl eval --probe-c), or more training samples"
                )
            val_scores = _sweep(xtr[fit_idx], ytr[fit_idx], xtr[val_idx], ytr[val_idx], cs, max_iter)
            best = cs[int(np.argmax([val_scores[f"{c:g}"] for c in cs]))]
        else:
            best = cs[0]
        accuracy = _fit_score(xtr, ytr, xte, yte, best, max_iter)
    n_fits = len(val_scores) + 1
    if not_converged:
        logger.warning(
            "linear probe: %d of %d logistic-regression fits stopped at max_iter=%d before converging "
            "(scikit-learn ConvergenceWarning); the chosen C=%g is still reported",
            len(not_converged),
            n_fits,
            max_iter,
            best,
        )
    return {
        "accuracy": accuracy,
        "C": best,
        "val_accuracy": val_scores.get(f"{best:g}"),
        "val_accuracies": val_scores,
        "n_train": int(xtr.shape[0]),
        "n_val": n_val,
        "n_not_converged": len(not_converged),
    }


def few_shot_probe(
    train_x: Any,
    train_y: Any,
    test_x: Any,
    test_y: Any,
    *,
    k: int,
    n_episodes: int = 5,
    seed: int = 0,
    Cs: Sequence[float] = DEFAULT_CS,
    val_fraction: float = 0.2,
    max_iter: int = 1000,
) -> dict[str, Any]:
    """k-shot probe: per episode draw k training samples per class, run `linear_probe` on them, score test.

    With k = 1 no validation split exists: pass a single C (e.g. `Cs=(1.0,)`).
    Returns {"k", "n_episodes", "accuracy_mean", "accuracy_std", "accuracies", "Cs"}.
    """
    xtr = as_matrix(train_x, name="train_x")
    ytr = as_labels(train_y, n=xtr.shape[0], name="train_y")
    if k < 1 or n_episodes < 1:
        raise ValueError(f"k and n_episodes must be >= 1, got k={k}, n_episodes={n_episodes}")
    classes, counts = np.unique(ytr, return_counts=True)
    if (counts < k).any():
        short = classes[counts < k].tolist()
        raise ValueError(f"classes {short} have fewer than k={k} training samples; lower k")
    rng = np.random.default_rng(seed)
    accs, chosen = [], []
    for episode in range(n_episodes):
        idx = np.concatenate([rng.choice(np.flatnonzero(ytr == c), size=k, replace=False) for c in classes])
        res = linear_probe(
            xtr[idx],
            ytr[idx],
            test_x,
            test_y,
            val_fraction=val_fraction,
            Cs=Cs,
            seed=seed + episode,
            max_iter=max_iter,
        )
        accs.append(res["accuracy"])
        chosen.append(res["C"])
    return {
        "k": k,
        "n_episodes": n_episodes,
        "accuracy_mean": float(np.mean(accs)),
        "accuracy_std": float(np.std(accs)),
        "accuracies": accs,
        "Cs": chosen,
    }
