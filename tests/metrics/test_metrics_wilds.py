"""iWildCam's macro F1 and FMoW's worst-region accuracy (DiVE Table 4), as WILDS computes them."""

import numpy as np
import pytest
from sklearn.metrics import f1_score

from hf_vrl.metrics import FMOW_REGIONS, macro_f1, worst_group_accuracy


def test_macro_f1_hand_case_and_scikit_learn():
    # class 0: tp 1, predicted 1, actual 2 -> 2/3; class 1: tp 1, predicted 1, actual 1 -> 1; class 2 is only
    # predicted, never a label: left out (WILDS passes labels=unique(y_true))
    assert macro_f1([0, 0, 1], [0, 2, 1]) == pytest.approx(5 / 6)
    rng = np.random.default_rng(0)
    truth, pred = rng.integers(0, 7, 200), rng.integers(0, 9, 200)
    expected = f1_score(truth, pred, average="macro", labels=np.unique(truth), zero_division=0)
    assert macro_f1(truth, pred) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="same non-zero length"):
        macro_f1([0, 1], [0])


def test_worst_region_accuracy_leaves_other_out():
    truth = [0, 0, 1, 1, 2, 2]
    pred = [0, 0, 1, 0, 0, 0]
    regions = ["Asia", "Asia", "Europe", "Europe", "Other", "Other"]
    out = worst_group_accuracy(truth, pred, regions, exclude=("Other",))
    assert out["worst"] == 0.5 and out["per_group"] == {"Asia": 1.0, "Europe": 0.5, "Other": 0.0}
    assert out["counts"] == {"Asia": 2, "Europe": 2, "Other": 2}
    assert worst_group_accuracy(truth, pred, regions)["worst"] == 0.0
    assert FMOW_REGIONS[-1] == "Other" and len(FMOW_REGIONS) == 6
    with pytest.raises(ValueError, match="no group left"):
        worst_group_accuracy([0], [0], ["Other"], exclude=("Other",))
