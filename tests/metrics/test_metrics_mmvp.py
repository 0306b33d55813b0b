from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vrl.errors import UserError
from hf_vrl.metrics import load_mmvp_vlm, mmvp_score
from hf_vrl.metrics.mmvp import MMVP_CATEGORIES, MMVP_PAIRS
from hf_vrl.paper_eval import MMVP_SHORT_NAMES, mmvp_row


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


# the Type spellings of the official Questions.csv: its image folders (tsb0601/MMVP README), in file order
OFFICIAL_TYPES = (
    "Orientation",
    "Presence",
    "State",
    "Quantity",
    "Spatial",
    "Color",
    "Structural_Character",
    "Text",
    "Camera_Perspective",
)


def official_pairs(types=OFFICIAL_TYPES, per_type=15, colours=("red", "blue")):
    """The official file's shape: 9 patterns x 15 pairs, question ids 1..270 in order."""
    return [
        (kind, (colours[0], f"{kind} a"), (colours[1], f"{kind} b"))
        for kind in types
        for _ in range(per_type)
    ]


def test_the_official_file_gets_the_official_scripts_categories(tmp_path, mmvp_writer):
    """evaluate_vlm.py names pair n `categories[n // 15]`, whatever the file's Type spelling: every one of the
    nine patterns is a column, none empty."""
    ds = load_mmvp_vlm(mmvp_writer(tmp_path, official_pairs()))
    assert len(ds) == MMVP_PAIRS == 135
    categories = ds["category"][:]
    assert categories[0] == categories[14] == "Orientation and Direction"  # qids 1-30
    assert categories[15] == "Presence of Specific Features" and categories[-1] == "Viewpoint and Perspective"
    assert [categories.count(c) for c in MMVP_CATEGORIES] == [15] * 9
    logits = np.tile([[1.0, 0.0], [0.0, 1.0]], (135, 1, 1))
    logits[:15] = [[0.0, 1.0], [0.0, 1.0]]  # every Orientation pair wrong
    row = mmvp_row(mmvp_score(logits, categories))
    assert set(row) == {*MMVP_SHORT_NAMES.values(), "Avg"} and row["Orientation"] == 0.0
    assert row["Viewpoint"] == 100.0 and row["Avg"] == pytest.approx(800 / 9)


def test_a_file_with_other_pairs_or_categories_is_refused(tmp_path, mmvp_writer):
    for name in ("short", "mixed", "merged", "longer"):
        (tmp_path / name).mkdir()
    root = mmvp_writer(tmp_path / "short", official_pairs()[:2])  # qids 1-4: two Orientation pairs
    with pytest.raises(UserError, match=r"2 of 135 pairs, 1 of 9 categories; .* --allow-partial"):
        load_mmvp_vlm(root)
    partial = load_mmvp_vlm(root, allow_partial=True)
    assert partial["category"][:] == ["Orientation and Direction"] * 2
    mixed = official_pairs()
    mixed[3] = ("Presence", ("red", "a"), ("blue", "b"))  # pair 4 is an Orientation pair by position
    with pytest.raises(
        UserError, match=r"pair 7/8: Type 'Presence' where the other pairs of 'Orientation and"
    ):
        load_mmvp_vlm(mmvp_writer(tmp_path / "mixed", mixed))
    first = official_pairs()
    first[30] = ("Presence", ("red", "a"), ("blue", "b"))  # the first pair of the third pattern: qids 61, 62
    (tmp_path / "first").mkdir()
    with pytest.raises(
        UserError,
        match=r"^pair 61/62: Type 'Presence' where the other pairs of 'State and Condition' .* say 'State'$",
    ):
        load_mmvp_vlm(mmvp_writer(tmp_path / "first", first))
    merged = official_pairs(types=("Orientation",) * 9)  # one spelling for every pattern
    with pytest.raises(UserError, match="spans several of the official patterns"):
        load_mmvp_vlm(mmvp_writer(tmp_path / "merged", merged))
    longer = official_pairs() + [("Extra", ("red", "a"), ("blue", "b"))]  # qids 271, 272
    with pytest.raises(UserError, match="within the official 270"):
        load_mmvp_vlm(mmvp_writer(tmp_path / "longer", longer))


@pytest.mark.parametrize("image_dir", ["MLLM_VLM Images", "MLLM_VLM_Images", "MMVP_VLM_Images"])
def test_load_mmvp_vlm_reads_the_official_layout(tmp_path, image_dir, mmvp_writer):
    pairs = [
        ("Orientation", ("red", "the sign says stop"), ("blue", "the sign says go")),
        ("Orientation", ("green", "two dogs"), ("red", "three dogs")),
    ]
    ds = load_mmvp_vlm(mmvp_writer(tmp_path, pairs, image_dir=image_dir), allow_partial=True)
    assert len(ds) == 2
    assert ds["qid_a"][:] == [1, 3] and ds["qid_b"][:] == [2, 4]
    assert ds["category"][:] == ["Orientation and Direction"] * 2
    assert ds["statement_a"][:] == ["the sign says stop", "two dogs"]
    assert ds["statement_b"][:] == ["the sign says go", "three dogs"]
    first = ds[0]
    assert isinstance(first["image_a"], Image.Image)
    assert first["image_a"].convert("RGB").getpixel((8, 8))[0] > 200  # red
    assert first["image_b"].convert("RGB").getpixel((8, 8))[2] > 200  # blue


def test_a_missing_image_is_refused_in_one_line_or_its_pair_left_out_with_allow_partial(
    tmp_path, mmvp_writer
):
    """--allow-partial covers a missing image as it covers missing pairs: the pair is left out and the counts
    say so; without it, one line naming the image and --allow-partial."""
    from hf_vrl.data.benchmarks import BENCHMARKS
    from hf_vrl.data.layouts import counts_of

    root = mmvp_writer(tmp_path, official_pairs())
    (root / "MLLM_VLM Images" / "State" / "61.jpg").unlink()
    with pytest.raises(
        UserError, match=r"1 of 270 images missing \(first: .*State/61.jpg\); .*--allow-partial"
    ):
        load_mmvp_vlm(root)
    pairs = load_mmvp_vlm(root, allow_partial=True)
    assert len(pairs) == 134 and 61 not in pairs["qid_a"][:]
    counts = counts_of(pairs, BENCHMARKS["mmvp_vlm"], "test")
    assert not counts.as_dict()["complete"] and "134 of 135" in counts.describe()


def test_load_mmvp_vlm_rejects_broken_folders(tmp_path, mmvp_writer):
    with pytest.raises(FileNotFoundError, match="Questions.csv"):
        load_mmvp_vlm(tmp_path)
    root = mmvp_writer(tmp_path, [("Texts", ("red", "a"), ("blue", "b"))])
    (root / "MLLM_VLM Images" / "Texts" / "2.jpg").unlink()
    with pytest.raises(UserError, match=r"no pair has both its images \(first missing: .*2.jpg\)"):
        load_mmvp_vlm(root, allow_partial=True)
    (root / "Questions.csv").write_text("Question ID,Type,Statement\n1,Texts,a\n2,Texts,b\n3,Texts,c\n")
    with pytest.raises(UserError, match="pairs"):
        load_mmvp_vlm(root)
    (root / "Questions.csv").write_text("id,kind,text\n1,Texts,a\n2,Texts,b\n")
    with pytest.raises(UserError, match="lacks columns"):
        load_mmvp_vlm(root)
    (root / "Questions.csv").write_text("Question ID,Type,Statement\n2,Texts,a\n1,Texts,b\n")
    with pytest.raises(UserError, match="not a pair"):
        load_mmvp_vlm(root)


def test_one_copy_of_the_scoring_serves_hf_vrl_and_the_evaluate_module():
    from hf_vrl.metrics import mmvp
    from hf_vrl.metrics.evaluate_modules.mmvp import scores

    assert mmvp.mmvp_score is scores.mmvp_score and mmvp.MMVP_CATEGORIES is scores.MMVP_CATEGORIES
    module = (Path(mmvp.__file__).parent / "evaluate_modules" / "mmvp" / "mmvp.py").read_text()
    assert "from .scores import mmvp_score" in module and "def mmvp_score" not in module
