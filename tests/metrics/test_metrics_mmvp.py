import numpy as np
import pytest
import torch
from PIL import Image

from hf_vrl.metrics import load_mmvp_vlm, mmvp_score


def test_pair_counts_only_when_both_statements_pick_their_image():
    logits = np.array(
        [
            [[2.0, 1.0], [1.0, 2.0]],  # both right
            [[2.0, 1.0], [2.0, 1.0]],  # statement 0 right, statement 1 wrong -> pair wrong
            [[1.0, 2.0], [1.0, 2.0]],  # statement 0 wrong, statement 1 right -> pair wrong
            [[1.0, 2.0], [2.0, 1.0]],  # both wrong
        ]
    )
    out = mmvp_score(torch.tensor(logits))
    assert out["accuracy"] == 0.25
    assert out["statement_accuracy"] == 0.5
    assert out["per_category"] == {"all": 0.25}
    assert out["n_pairs"] == 4


def test_ties_follow_the_official_rule():
    """prob(image 0) = 0.5 is not > 0.5, so a tie picks image 1: right for statement 1, wrong for 0."""
    tie = np.zeros((1, 2, 2))
    out = mmvp_score(tie)
    assert out["statement_accuracy"] == 0.5 and out["accuracy"] == 0.0


def test_per_category_and_mean():
    right = [[1.0, 0.0], [0.0, 1.0]]
    wrong = [[0.0, 1.0], [0.0, 1.0]]
    logits = np.array([right, wrong, right, right, wrong])
    out = mmvp_score(logits, ["A", "A", "B", "B", "C"])
    assert out["per_category"] == {"A": 0.5, "B": 1.0, "C": 0.0}
    assert out["mean_category_accuracy"] == pytest.approx(0.5)
    assert out["accuracy"] == pytest.approx(3 / 5)


def test_mmvp_score_errors():
    with pytest.raises(ValueError, match="shape"):
        mmvp_score(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="categories"):
        mmvp_score(np.zeros((2, 2, 2)), ["A"])


@pytest.mark.parametrize("image_dir", ["MLLM_VLM Images", "MLLM_VLM_Images"])
def test_load_mmvp_vlm_reads_the_official_layout(tmp_path, image_dir, mmvp_writer):
    pairs = [
        ("Texts", ("red", "the sign says stop"), ("blue", "the sign says go")),
        ("Quantity and Count", ("green", "two dogs"), ("red", "three dogs")),
    ]
    ds = load_mmvp_vlm(mmvp_writer(tmp_path, pairs, image_dir=image_dir))
    assert len(ds) == 2
    assert ds["qid_a"][:] == [1, 3] and ds["qid_b"][:] == [2, 4]
    assert ds["category"][:] == ["Texts", "Quantity and Count"]
    assert ds["statement_a"][:] == ["the sign says stop", "two dogs"]
    assert ds["statement_b"][:] == ["the sign says go", "three dogs"]
    first = ds[0]
    assert isinstance(first["image_a"], Image.Image)
    assert first["image_a"].convert("RGB").getpixel((8, 8))[0] > 200  # red
    assert first["image_b"].convert("RGB").getpixel((8, 8))[2] > 200  # blue


def test_load_mmvp_vlm_rejects_broken_folders(tmp_path, mmvp_writer):
    with pytest.raises(FileNotFoundError, match="Questions.csv"):
        load_mmvp_vlm(tmp_path)
    root = mmvp_writer(tmp_path, [("Texts", ("red", "a"), ("blue", "b"))])
    (root / "MLLM_VLM Images" / "Texts" / "2.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="2.jpg"):
        load_mmvp_vlm(root)
    (root / "Questions.csv").write_text("Question ID,Type,Statement\n1,Texts,a\n2,Texts,b\n3,Texts,c\n")
    with pytest.raises(ValueError, match="pairs"):
        load_mmvp_vlm(root)
    (root / "Questions.csv").write_text("id,kind,text\n1,Texts,a\n2,Texts,b\n")
    with pytest.raises(ValueError, match="lacks columns"):
        load_mmvp_vlm(root)
    (root / "Questions.csv").write_text("Question ID,Type,Statement\n2,Texts,a\n1,Texts,b\n")
    with pytest.raises(ValueError, match="not a pair"):
        load_mmvp_vlm(root)
