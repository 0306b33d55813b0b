"""examples/run_dive.py: objectives and seeds from one pre-trained CLIP, one table of mean ± std."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "run_dive.py"
# dive-tiny shrunk (as test_dive_method's TINY): a few pre-training steps, 2 fine-tuning steps of batch 8
TINY = [
    "--pretrain-steps", "2", "--pretrain-data", '{"fashion_mnist": 32, "shapes": 32}',
    "--pretrain-batch-size", "16", "--train-limit", "80", "--batch-size", "8", "--max-steps", "2",
    "--warmup-steps", "1", "--save-steps", "2", "--eval-limit", "30", "--reference-dataset", "shapes",
    "--reference-limit", "16", "--val-size", "8", "--wise-ft-alphas", "0.5", "--rsa-limit", "8",
    "--zero-shot-datasets", "shapes", "--rsa-dataset", "shapes",
]  # fmt: skip


def test_the_table_has_every_variant_with_mean_and_spread_over_seeds(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("run_dive", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv = ["--output-dir", str(tmp_path), "--objectives", "flyp", "wise_ft", "dive", "--seeds", "0", "1"]
    assert example.run([*argv, *TINY]) == 0
    out = capsys.readouterr().out
    seeds, paired = out.split("over seeds:\n")[-1].split("\nDiVE against each")
    table = [re.split(r"\s{2,}", line.strip()) for line in seeds.strip().splitlines()]
    assert table[0] == ["ID", "OOD", "transfer", "RSA image"]
    assert [row[0] for row in table[1:]] == ["pre-trained", "FLYP", "WiSE-FT (FLYP)", "DiVE"]
    for row in table[1:]:
        assert all(re.fullmatch(r"\d+\.\d ± \d+\.\d", cell) for cell in row[1:]) and len(row) == 5, row
    tests = [re.split(r"\s{2,}", line.strip()) for line in paired.split("p-value:\n")[-1].splitlines()]
    assert tests[0] == ["vs", "ID", "OOD", "transfer", "RSA image"]
    assert [row[0] for row in tests[1:]] == ["pre-trained", "FLYP", "WiSE-FT (FLYP)"]
    for row in tests[1:]:
        assert all(re.fullmatch(r"[+-]\d+\.\d \(p (-|\d\.\d{3})\)", c) for c in row[1:]) and len(row) == 5, (
            row
        )
    # one pre-training (the first run's), reused by every later run
    assert list(tmp_path.glob("*/*/inputs/pretrained")) == [
        tmp_path / "seed0" / "flyp" / "inputs" / "pretrained"
    ]
    assert (tmp_path / "seed1" / "flyp" / "exports" / "wise-ft" / "wise_ft.json").is_file()


def test_paired_t_tests_over_seeds():
    """DiVE against each method, paired by seed: scipy's ttest_rel, '-' where the differences do not vary."""
    from scipy.stats import ttest_rel

    spec = importlib.util.spec_from_file_location("run_dive", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    def section(top1, ood=0.5, transfer=0.5, rsa=0.9):
        return {"zero_shot": {"top1": top1}, "ood": {"top1": ood}, "transfer": {"top1": transfer},
                "rsa": {"image": rsa}}  # fmt: skip

    dive, flyp = [0.80, 0.82, 0.81], [0.78, 0.79, 0.80]
    rows = {"FLYP": [section(v) for v in flyp], "DiVE": [section(v) for v in dive]}
    p = example.paired_p_value([100 * v for v in dive], [100 * v for v in flyp])
    assert p == ttest_rel([100 * v for v in dive], [100 * v for v in flyp]).pvalue and 0 < p < 0.2
    assert (
        example.paired_p_value([1.0], [0.5]) is None
        and example.paired_p_value([1.0, 2.0], [0.0, 1.0]) is None
    )
    row = re.split(r"\s{2,}", example.paired_table(rows).splitlines()[1].strip())
    assert row[0] == "FLYP" and row[1] == f"+2.0 (p {p:.3f})" and row[2] == "+0.0 (p -)"
