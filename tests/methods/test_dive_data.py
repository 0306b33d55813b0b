"""DiVE's data and settings: FLYP captions, the reference batches (shards, passes, exact continuation), the
frozen model following the trained one (device rule), and the settings' validation."""

from __future__ import annotations

import pytest
import torch
from dive_helpers import collate, model, rows

from hf_vrl.data.toy import shapes_dataset
from hf_vrl.errors import UserError
from hf_vrl.methods.dive.data import REFERENCE_INDEX, FLYPCollator, ReferenceLoader, class_captions
from hf_vrl.methods.dive.frozen import FrozenReference, embed_pair
from hf_vrl.methods.dive.settings import DiVESettings

TEMPLATES = ["a photo of a {}.", "art of the {}."]


def test_class_captions_hand_case():
    got = class_captions([0, 1, 1], ["cat", "owl"], TEMPLATES, [0, 1, 2])
    assert got == [
        "a photo of a cat.",
        "art of the owl.",
        "a photo of a owl.",
    ]  # 2 % 2 = 0; filled verbatim, as FLYP and the evaluation's prompts are
    with pytest.raises(ValueError, match="no class name"):
        class_captions([3], ["cat"], TEMPLATES, [0])


class _Tokenizer:
    """Records the captions it is given (the collator's own work is what is under test)."""

    model_input_names = ["input_ids", "attention_mask"]
    model_max_length = 8

    def __init__(self):
        self.seen = []

    def __call__(self, captions, **kwargs):
        self.seen.append(list(captions))
        ids = torch.ones(len(captions), 3, dtype=torch.long)
        return {"input_ids": ids, "attention_mask": ids}


def _image_processor(images, return_tensors):
    return {"pixel_values": torch.zeros(len(images), 3, 4, 4)}


def test_flyp_captions_come_from_the_row_seed():
    data = shapes_dataset(6, seed=0, image_size=8)
    names = data.features["label"].names
    batch_rows = [{**data[i], "sample_seed": 1000 + i} for i in range(6)]
    tokenizer = _Tokenizer()
    collator = FLYPCollator(_image_processor, tokenizer, names, TEMPLATES)
    torch.manual_seed(0)
    collator(batch_rows)
    torch.manual_seed(1)  # the global RNG plays no part when rows carry a seed
    collator(batch_rows)
    first, second = tokenizer.seen
    assert first == second
    picks = [int(torch.randint(2, (), generator=torch.Generator().manual_seed(1000 + i))) for i in range(6)]
    assert first == class_captions([row["label"] for row in batch_rows], names, TEMPLATES, picks)


def test_flyp_captions_without_seed_use_the_global_rng():
    data = shapes_dataset(8, seed=0, image_size=8)
    tokenizer = _Tokenizer()
    collator = FLYPCollator(_image_processor, tokenizer, data.features["label"].names, TEMPLATES)
    for seed in (0, 0, 5):
        torch.manual_seed(seed)
        collator([data[i] for i in range(8)])
    assert tokenizer.seen[0] == tokenizer.seen[1] != tokenizer.seen[2]


def _indices(batches):
    return [batch[REFERENCE_INDEX].tolist() for batch in batches]


def test_reference_loader_draws_by_global_position_reshuffles_passes_and_continues():
    """Draws of 4 rows from 10 (2 whole draws per pass): 2 processes take 2 rows each of the very rows one
    process draws, so what a run draws does not depend on its process count."""
    data = [{"x": torch.tensor(float(i))} for i in range(10)]
    single = ReferenceLoader(data, collate, 4, seed=3)
    draws = _indices([next(single) for _ in range(6)])
    assert draws[0] != [0, 1, 2, 3] and draws[:2] != draws[2:4]  # shuffled; each pass reshuffles
    for rank in range(2):
        loader = ReferenceLoader(data, collate, 2, seed=3, rank=rank, world_size=2)
        batches = [next(loader) for _ in range(6)]
        assert _indices(batches) == [draw[2 * rank : 2 * rank + 2] for draw in draws]
        assert [b["x"].int().tolist() for b in batches] == _indices(batches)  # the index is the row
        resumed = ReferenceLoader(data, collate, 2, seed=3, rank=rank, world_size=2, start=3)
        assert _indices([next(resumed) for _ in range(3)]) == _indices(batches[3:])
        assert loader.drawn == 6 and resumed.drawn == 6


def test_reference_loader_refuses_a_set_smaller_than_a_batch():
    with pytest.raises(UserError, match="reference_batch_size"):
        ReferenceLoader(rows(3, 0), collate, 2, world_size=2)


@pytest.mark.parametrize("mode", ["forward", "cache"])
def test_frozen_model_follows_the_trained_model(device, mode):
    trained, frozen_copy = model().to(device), model()
    frozen = FrozenReference(frozen_copy, mode=mode, cache_size=8)
    batch = collate(rows(4, seed=1)) | {REFERENCE_INDEX: torch.tensor([0, 3, 5, 7])}
    image, text = frozen.embed(batch, trained)  # the batch may sit on the CPU; the frozen model moves
    assert image.device.type == device.type and text.device.type == device.type
    assert next(frozen.model.parameters()).device.type == device.type
    with torch.no_grad():
        want = embed_pair(trained, {k: v.to(device) for k, v in batch.items()})
    torch.testing.assert_close(image, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(text, want[1], rtol=1e-5, atol=1e-6)
    assert not any(p.requires_grad for p in frozen.model.parameters())


def test_frozen_model_keeps_its_own_dtype_when_given(device):
    frozen = FrozenReference(model(), dtype=torch.bfloat16)
    image, _ = frozen.embed(collate(rows(2, seed=1)), model().to(device))
    assert frozen.model.dtype == torch.bfloat16 and image.dtype == torch.float32


def test_cache_computes_each_sample_once():
    calls = []
    frozen = FrozenReference(model(), mode="cache", cache_size=6)
    original = frozen._forward
    frozen._forward = lambda batch: calls.append(len(batch["pixel_values"])) or original(batch)
    data = rows(6, seed=1)
    for index in ([0, 1, 2], [2, 3, 4], [4, 1, 0]):
        frozen.embed(collate([data[i] for i in index]) | {REFERENCE_INDEX: torch.tensor(index)}, model())
    assert calls == [3, 2] and frozen.cached == 5


# -- settings ----------------------------------------------------------------------------------------------


def test_paper_defaults():
    s = DiVESettings(reference_dataset="webdataset:cc3m/{00000..00331}.tar")
    assert (s.objective, s.lambda_dive, s.alpha, s.lambda_snd, s.lambda_replay) == (
        "dive",
        1000.0,
        0.99,
        1.0,
        1.0,
    )
    assert s.wise_ft_alphas == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert s.uses_reference and s.dive_terms == ("avl", "pvl") and s.difference == "vector"
    assert DiVESettings(objective="flyp").uses_reference is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"objective": "lwf"}, "objective must be one of"),
        ({"alpha": 1.5}, "alpha"),
        ({"lambda_dive": -1.0}, "lambda_dive"),
        ({"lambda_snd": float("nan")}, "lambda_snd"),
        ({"reference_batch_size": 0}, "reference_batch_size"),
        ({"templates": ["a photo"]}, "'{}'"),
        ({"templates": []}, "templates is empty"),
        ({"frozen_embeddings": "disk"}, "frozen_embeddings"),
        ({"frozen_dtype": "int8"}, "frozen_dtype"),
        ({"wise_ft_alphas": [0.5, 2.0]}, "wise_ft_alphas"),
        ({"rsa_limit": 2}, "rsa_limit"),
    ],
)
def test_settings_name_what_to_change(kwargs, message):
    with pytest.raises(UserError, match=message):
        DiVESettings(**({"reference_dataset": "shapes"} | kwargs))


def test_an_objective_without_its_reference_set_is_a_run_problem():
    assert DiVESettings(objective="flyp").reference_problems() == []
    (problem,) = DiVESettings(objective="snd").reference_problems()
    assert problem.startswith("dive.reference_dataset") and "objective flyp" in problem


def test_every_field_has_help():
    from dataclasses import fields

    assert all(f.metadata.get("help") for f in fields(DiVESettings))
