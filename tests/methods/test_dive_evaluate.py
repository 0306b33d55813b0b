"""WiSE-FT, the paper's evaluation (ID / OOD / transfer / RSA), the style shifts, class subsets and the export
as stock transformers checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
from dive_helpers import IMAGE_SIZE, model, random_tiny_clip_world, tiny_diffclip, tiny_siglip
from PIL import Image
from transformers import CLIPModel, CLIPVisionModel

from hf_vrl.data.toy import shapes_dataset
from hf_vrl.evaluation import evaluate_clip
from hf_vrl.methods.dive.data import select_classes
from hf_vrl.methods.dive.ensemble import choose_wise_ft, interpolate_weights
from hf_vrl.methods.dive.evaluate import evaluate_dive, flatten_report, id_accuracy
from hf_vrl.methods.dive.export import export_model, export_vision_tower, vision_tower
from hf_vrl.methods.dive.shifts import shift_dataset, shift_image

TEMPLATES = ["a photo of a {}.", "a drawing of a {}."]


def constant_clip(value: float) -> CLIPModel:
    clip = model()
    with torch.no_grad():
        for param in clip.parameters():
            param.fill_(value)
    return clip


def test_interpolation_hand_case(device):
    pre, ft = constant_clip(0.0), constant_clip(1.0).to(device)
    mixed = interpolate_weights(pre, ft, 0.3)
    for name, value in mixed.state_dict().items():
        assert value.device.type == device.type
        if value.is_floating_point():
            torch.testing.assert_close(value, torch.full_like(value, 0.3), msg=name)
        else:  # integer buffers (position ids) are the fine-tuned model's
            assert torch.equal(value, ft.state_dict()[name])
    for alpha, want in ((0.0, pre), (1.0, ft)):
        for a, b in zip(interpolate_weights(pre, ft, alpha).parameters(), want.parameters()):
            torch.testing.assert_close(a, b.to(a.device))
    assert next(ft.parameters()).flatten()[0].item() == 1.0  # the inputs are left untouched


def test_wise_ft_picks_the_best_validation_coefficient():
    pre, ft = constant_clip(0.0), constant_clip(1.0)

    def score(ensemble):  # peaks at a = 0.37 (read back from the weights)
        return -abs(next(ensemble.parameters()).flatten()[0].item() - 0.37)

    best, scores, ensemble = choose_wise_ft(pre, ft, score)
    assert best == 0.4 and sorted(scores) == pytest.approx([0.1 * k for k in range(1, 10)])
    assert next(ensemble.parameters()).flatten()[0].item() == pytest.approx(0.4)
    assert choose_wise_ft(pre, ft, lambda m: 1.0, alphas=[0.7, 0.2, 0.5])[0] == 0.2  # ties: the smallest


def test_interpolation_needs_the_same_architecture():
    from hf_vrl.methods.dcr.toy import tiny_clip

    with pytest.raises(ValueError, match="architecture"):
        interpolate_weights(model(), tiny_clip(image_size=IMAGE_SIZE, vocab_size=100, width=16), 0.5)


# -- evaluation ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_world():
    return random_tiny_clip_world()


def test_evaluate_dive_layout_and_values(toy_world, device):
    clip, image_processor, tokenizer, data = toy_world
    clip = copy.deepcopy(clip).to(device)  # the module's fixture stays on the CPU
    pretrained = CLIPModel(clip.config).eval()  # on the CPU: it follows the evaluated model
    ood = {name: shift_dataset(data, name) for name in ("inverted", "blurred")}
    report = evaluate_dive(
        clip, image_processor, tokenizer, id_dataset=data, ood_datasets=ood, transfer_datasets={"same": data},
        rsa_dataset=data, pretrained_model=pretrained, templates=TEMPLATES,
    )  # fmt: skip
    direct = evaluate_clip(clip, image_processor, tokenizer, data, tasks=("zero_shot",), templates=TEMPLATES)
    assert report["id"] == flatten_report(direct, ("zero_shot",))
    assert report["id"]["zero_shot.top1"] == id_accuracy(clip, image_processor, tokenizer, data, TEMPLATES)
    summary = report["summary"]
    ood_mean = sum(r["zero_shot.top1"] for r in report["ood"].values()) / 2
    assert summary["ood.top1"] == pytest.approx(ood_mean)
    assert set(summary) == {"id.top1", "ood.top1", "transfer.top1", "rsa.image", "rsa.text"}
    assert -1.0 <= summary["rsa.image"] <= 1.0 and summary["rsa.image"] < 0.999  # another random model
    same = evaluate_dive(clip, image_processor, tokenizer, rsa_dataset=data, pretrained_model=clip)
    assert same["summary"]["rsa.image"] == pytest.approx(1.0) and same["summary"][
        "rsa.text"
    ] == pytest.approx(1.0)
    assert same["summary"]["ood.top1"] is None and "id" not in same


def test_rsa_needs_the_pretrained_model(toy_world):
    clip, image_processor, tokenizer, data = toy_world
    with pytest.raises(ValueError, match="pretrained_model"):
        evaluate_dive(clip, image_processor, tokenizer, rsa_dataset=data)


# -- data helpers ------------------------------------------------------------------------------------------


def test_shifts_are_deterministic_styles():
    image = Image.new("RGB", (8, 8), (0, 0, 0))
    image.putpixel((4, 4), (255, 255, 255))
    assert shift_image(image, "inverted").getpixel((0, 0)) == (255, 255, 255)
    assert shift_image(shift_image(image, "inverted"), "inverted").tobytes() == image.tobytes()
    assert shift_image(image, "recoloured").getpixel((0, 0)) == (20, 20, 110)
    blurred = shift_image(image, "blurred", blur_fraction=0.15)
    assert 0 < blurred.getpixel((4, 4))[0] < 255 and blurred.getpixel((3, 4))[0] > 0
    with pytest.raises(ValueError, match="unknown shift"):
        shift_image(image, "rotated")


def test_shift_dataset_keeps_labels_and_captions():
    data = shapes_dataset(4, seed=0, image_size=16)
    shifted = shift_dataset(data, "inverted")
    assert shifted["label"] == data["label"] and shifted["caption"] == data["caption"]
    assert shifted[0]["image"].tobytes() == shift_image(data[0]["image"], "inverted").tobytes()


def test_select_classes_relabels():
    data = shapes_dataset(40, seed=0, image_size=8)
    names = data.features["label"].names
    subset = select_classes(data, [3, 1])
    assert subset.features["label"].names == [names[3], names[1]]
    assert len(subset) == sum(label in (1, 3) for label in data["label"])
    want = [{3: 0, 1: 1}[label] for label in data["label"] if label in (1, 3)]
    assert subset["label"] == want


# -- export ------------------------------------------------------------------------------------------------


def test_export_plain_clip_and_vision_tower(tmp_path, toy_world):
    clip, image_processor, tokenizer, data = toy_world
    export_model(clip, tmp_path / "final", image_processor, tokenizer)
    export_vision_tower(clip, tmp_path / "vision", image_processor)
    reloaded = CLIPModel.from_pretrained(tmp_path / "final")
    tower = CLIPVisionModel.from_pretrained(tmp_path / "vision")
    assert type(reloaded) is CLIPModel and type(tower) is CLIPVisionModel
    pixels = image_processor(images=data["image"][:3], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want = clip.vision_model(pixel_values=pixels).pooler_output
        torch.testing.assert_close(tower(pixel_values=pixels).pooler_output, want)
        torch.testing.assert_close(reloaded.vision_model(pixel_values=pixels).pooler_output, want)
    assert (tmp_path / "vision" / "preprocessor_config.json").is_file()
    assert (tmp_path / "final" / "tokenizer.json").is_file()


def test_vision_tower_of_siglip_and_diffclip():
    from transformers import SiglipVisionModel

    from hf_vrl.models.diffclip import DiffCLIPVisionModel

    siglip = tiny_siglip()
    tower = vision_tower(siglip)
    assert type(tower) is SiglipVisionModel
    pixels = torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE)
    with torch.no_grad():
        torch.testing.assert_close(
            tower(pixel_values=pixels).pooler_output, siglip.vision_model(pixels).pooler_output
        )
    assert isinstance(vision_tower(tiny_diffclip()), DiffCLIPVisionModel)
    with pytest.raises(TypeError, match="cannot export"):
        vision_tower(torch.nn.Linear(2, 2))


# -- model glue --------------------------------------------------------------------------------------------


def test_load_dual_encoder_from_a_config_preset_and_a_half_precision_checkpoint(tmp_path):
    from hf_vrl.methods.dive.model import load_dual_encoder

    clip, image_processor, tokenizer = load_dual_encoder("tiny-clip")  # config + processors, no weights
    assert type(clip) is CLIPModel and clip.dtype == torch.float32 and tokenizer is not None
    export_model(clip.to(torch.float16), tmp_path / "half", image_processor, tokenizer)
    reloaded, _, _ = load_dual_encoder(str(tmp_path / "half"))
    assert reloaded.dtype == torch.float32
    for a, b in zip(reloaded.parameters(), clip.parameters()):
        assert torch.equal(a, b.float())  # upcasting is exact


def test_load_dual_encoder_refuses_a_vision_tower(tmp_path, toy_world):
    from hf_vrl.errors import UserError
    from hf_vrl.methods.dive.model import load_dual_encoder

    clip, image_processor, _, _ = toy_world
    export_vision_tower(clip, tmp_path / "vision", image_processor)
    with pytest.raises(UserError, match="both towers"):
        load_dual_encoder(str(tmp_path / "vision"))


def test_evaluation_and_reference_sets_load_from_the_settings():
    from hf_vrl.methods.dive.data import load_reference_dataset
    from hf_vrl.methods.dive.evaluate import load_evaluation_sets
    from hf_vrl.methods.dive.settings import DiVESettings

    sets = dict(ood_datasets=["digits"], zero_shot_datasets=["shapes"], rsa_dataset="shapes", rsa_limit=5)
    settings = DiVESettings(reference_dataset="shapes", reference_limit=12, **sets)
    assert len(load_reference_dataset(settings, image_size=8)) == 12
    sets = load_evaluation_sets(settings, limit=7, image_size=8)
    assert len(sets["ood_datasets"]["digits"]) == 7 and len(sets["transfer_datasets"]["shapes"]) == 7
    assert len(sets["rsa_dataset"]) == 5
