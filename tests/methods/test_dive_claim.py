"""DiVE's claim at toy size, over several seeds (slow): the dive-tiny preset with FLYP and with DiVE from one
pre-trained tiny CLIP, each seed fine-tuning both on the same data (the paper reports three seeds)."""

from __future__ import annotations

import numpy as np
import pytest

import hf_vrl
from hf_vrl.evaluation import text_table

METRICS = ("zero_shot.top1", "ood.top1", "transfer.top1", "rsa.image")


def metric(report: dict, name: str) -> float:
    group, key = name.split(".")
    return report["after"][group][key]


@pytest.mark.slow
def test_dive_keeps_transfer_and_geometry_at_flyps_id_accuracy(tmp_path):
    """About 3 minutes on 2 cores. Asserted, per seed: DiVE's zero-shot transfer accuracy and RSA above
    FLYP's; on the mean: ID within 3 points, FLYP above the pre-trained ID accuracy. OOD is printed, not
    asserted: in this world FLYP is ahead on it (3-seed means: ID 39.5 / 39.1, OOD 25.8 / 23.6, transfer
    23.2 / 33.5, RSA image 0.727 / 0.890 for FLYP / DiVE), against the paper's claim."""
    pretrained = tmp_path / "seed0-flyp" / "inputs" / "pretrained"
    rows = {"FLYP": [], "DiVE": []}
    before = None
    for seed in (0, 1, 2):
        for name, objective in (("FLYP", "flyp"), ("DiVE", "dive")):
            reuse = {"pretrained": str(pretrained), "pretrain_steps": 0} if pretrained.is_dir() else {}
            report = hf_vrl.train(
                "dive", objective=objective, seed=seed, output_dir=str(tmp_path / f"seed{seed}-{objective}"),
                eval_before=before is None, **reuse,
            )  # fmt: skip
            before = before or report["before"]
            rows[name].append([metric(report, m) for m in METRICS])
    means = {name: np.mean(values, axis=0) for name, values in rows.items()}
    table = [
        ["", *METRICS],
        ["pre-trained", *(f"{100 * before[m.split('.')[0]][m.split('.')[1]]:.1f}" for m in METRICS)],
    ]
    table += [[name, *(f"{100 * v:.1f}" for v in mean)] for name, mean in means.items()]
    print(text_table(table, left_columns=1))
    flyp, dive = np.array(rows["FLYP"]), np.array(rows["DiVE"])
    assert (dive[:, 2] > flyp[:, 2]).all() and (dive[:, 3] > flyp[:, 3]).all()
    assert abs(means["DiVE"][0] - means["FLYP"][0]) < 0.03
    assert means["FLYP"][0] > before["zero_shot"]["top1"]
