"""swap_vision_tower and `hf-vrl export-llava`: towers of every family hf_vrl exports into a tiny LLaVA, the
fit checks and their errors, the processor, and saved folders reloaded with plain transformers (remote code
for DiffCLIP, in a fresh interpreter without hf_vrl)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from llava_helpers import (
    IMAGE_SIZE,
    IMAGE_TOKEN,
    clip_tower,
    diffclip_tower,
    siglip_tower,
    tiny_llava,
    vit_tower,
)
from PIL import Image
from safetensors import safe_open
from transformers import (
    AutoProcessor,
    CLIPImageProcessorPil,
    CLIPTextConfig,
    CLIPTextModel,
    CLIPVisionModel,
    CLIPVisionModelWithProjection,
    LlavaForConditionalGeneration,
    ViTImageProcessorPil,
)

from hf_vrl.cli import COMMANDS
from hf_vrl.cli import main as cli_main
from hf_vrl.devices import module_device, module_dtype, to_device
from hf_vrl.errors import UserError
from hf_vrl.integrations.llava import (
    as_vision_tower,
    llava_processor_for,
    load_vision_tower,
    save_llava,
    swap_vision_tower,
)
from hf_vrl.integrations.llava_export import main as export_main
from hf_vrl.methods.dcr.export import export_vision_tower
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel
from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPModel, DiffCLIPVisionModel


def _batch(processor, images, device, dtype=None) -> dict:
    batch = processor(images=list(images), text=[IMAGE_TOKEN] * len(images), return_tensors="pt")
    return to_device(dict(batch), device, dtype)


def _image_features(llava, pixel_values) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack(list(llava.get_image_features(pixel_values=pixel_values).pooler_output))


def _generate(llava, batch) -> torch.Tensor:
    return llava.generate(**batch, max_new_tokens=4, min_new_tokens=4, do_sample=False)


def _dcr_export(folder, seed: int = 1):
    """A real DCR export (LoRA-free DCRModel around a tiny CLIP) with its image processor."""
    dcr = DCRModel.from_clip(
        tiny_clip(image_size=IMAGE_SIZE, seed=seed), condition_dim=16, num_condition_tokens=5
    )
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return export_vision_tower(dcr, folder, image_processor=image_processor)


def test_dcr_export_swaps_in_and_generate_runs_before_and_after(llava, processor, shapes, tmp_path, device):
    tower = load_vision_tower(_dcr_export(tmp_path / "tower"))
    assert type(tower) is CLIPVisionModel
    llava = llava.to(device).eval()
    batch = _batch(processor, shapes["image"][:2], device)
    generated_before = _generate(llava, batch)
    features_before = _image_features(llava, batch["pixel_values"])

    fit = swap_vision_tower(llava, tower)
    assert fit.problems == [] and fit.notes == [] and not fit.needs_new_projector
    assert llava.model.vision_tower is tower and module_device(tower).type == device.type
    generated_after = _generate(llava, batch)
    assert generated_before.shape == generated_after.shape == (2, batch["input_ids"].shape[1] + 4)
    features_after = _image_features(llava, batch["pixel_values"])
    assert features_after.shape == features_before.shape == (2, 16, 32)
    assert not torch.allclose(features_after, features_before, atol=1e-3)


@pytest.mark.parametrize("layer, strategy", [(-2, "default"), (-1, "full"), ([0, -1], "default")])
def test_diffclip_hidden_states_follow_llava_feature_selection(llava, device, layer, strategy):
    """LLaVA reads the DiffCLIP tower's hidden states as a CLIP's: embeddings first, CLS first ('default'
    drops it, 'full' keeps it), several layers concatenated."""
    tower = diffclip_tower()
    swap_vision_tower(
        llava, tower, realign=True, vision_feature_layer=layer, vision_feature_select_strategy=strategy
    )
    llava = llava.to(device).eval()
    pixel_values = torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE, device=device)
    with torch.no_grad():
        states = tower(pixel_values, output_hidden_states=True).hidden_states
        embeddings = tower.pre_layrnorm(tower.embeddings(pixel_values))
        layers = [layer] if isinstance(layer, int) else layer
        selected = torch.cat([states[i] if strategy == "full" else states[i][:, 1:] for i in layers], dim=-1)
        expected = llava.model.multi_modal_projector(selected)
    assert len(states) == tower.config.num_hidden_layers + 1
    torch.testing.assert_close(states[0], embeddings)
    torch.testing.assert_close(_image_features(llava, pixel_values), expected)


def test_swap_casts_the_tower_to_the_llava_dtype_and_device(llava, processor, shapes, device):
    llava = llava.to(device=device, dtype=torch.float16).eval()
    swap_vision_tower(llava, diffclip_tower())
    assert {parameter.dtype for parameter in llava.parameters()} == {torch.float16}
    assert module_device(llava.model.vision_tower).type == device.type
    assert llava.config.vision_config.dtype == torch.float16
    batch = _batch(processor, shapes["image"][:1], device, module_dtype(llava))
    assert _generate(llava, batch).shape == (1, batch["input_ids"].shape[1] + 4)


@pytest.mark.parametrize(
    "build, options, message",
    [
        (
            lambda: clip_tower(hidden_size=48),
            {},
            r"hidden width: the projector takes 32-wide .* gives 48.*llava-align",
        ),
        (
            lambda: clip_tower(image_size=24),
            {},
            r"patch grid: .* 16 image tokens \(4x4 .* 36 image tokens \(6x6",
        ),
        (siglip_tower, {}, r"no CLS token.*'full'"),
        (clip_tower, {"vision_feature_layer": -4}, r"not a hidden state of this 2-layer tower"),
        (
            lambda: CLIPTextModel(CLIPTextConfig(hidden_size=32, intermediate_size=64)),
            {},
            r"not a vision tower",
        ),
    ],
)
def test_a_tower_that_does_not_fit_is_refused_with_what_differs(llava, build, options, message):
    old_tower = llava.model.vision_tower
    with pytest.raises(UserError, match=message):
        swap_vision_tower(llava, build(), **options)
    assert llava.model.vision_tower is old_tower and llava.config.vision_config is old_tower.config


def test_a_grid_the_language_model_cannot_hold_is_refused(tokenizer):
    llava = tiny_llava(tokenizer, max_positions=16)
    with pytest.raises(UserError, match=r"more than the language model's 16 positions"):
        swap_vision_tower(llava, clip_tower(), realign=True)


def test_realign_gives_a_new_projector_and_a_processor_with_the_new_token_count(
    llava, processor, shapes, device
):
    old_projector = llava.model.multi_modal_projector
    fit = swap_vision_tower(llava, clip_tower(hidden_size=48, image_size=24), realign=True)
    assert len(fit.problems) == 2 and "image size" in fit.notes[0] and fit.needs_new_projector
    projector = llava.model.multi_modal_projector
    assert projector is not old_projector and projector.linear_1.in_features == 48
    assert llava.config.image_seq_length == 36 and llava.config.vision_config.hidden_size == 48

    new_processor = llava_processor_for(llava, processor)
    batch = _batch(new_processor, shapes["image"][:2], device)
    image_token_id = llava.config.image_token_id
    assert (batch["input_ids"] == image_token_id).sum(dim=1).tolist() == [36, 36]
    assert batch["pixel_values"].shape[-2:] == (24, 24)
    llava = llava.to(device).eval()
    with torch.no_grad():
        assert llava(**batch).logits.shape[:2] == batch["input_ids"].shape


def test_a_siglip_tower_fits_with_the_full_strategy(llava, processor, shapes, device):
    """No CLS token: 'full' keeps the 16 patch tokens, the count the language model was trained on."""
    fit = swap_vision_tower(llava, siglip_tower(), vision_feature_select_strategy="full")
    assert fit.problems == [] and fit.tower.extra_tokens == 0
    new_processor = llava_processor_for(llava, processor)
    assert (
        new_processor.num_additional_image_tokens == 0
        and new_processor.vision_feature_select_strategy == "full"
    )
    batch = _batch(new_processor, shapes["image"][:1], device)
    assert (batch["input_ids"] == llava.config.image_token_id).sum().item() == 16
    assert _generate(llava.to(device).eval(), batch).shape[0] == 1


def test_a_vit_backbone_with_its_own_image_processor_round_trips(
    tokenizer, processor, shapes, tmp_path, device
):
    """CLUE's export, a plain ViTModel, is a CLIP-like tower to LLaVA (CLS first, embeddings first). The
    LLaVA comes from a folder, so transformers has recorded its CLIP tower's key renames: they must not reach
    the ViT."""
    llava = LlavaForConditionalGeneration.from_pretrained(
        _save_llava_checkpoint(tokenizer, processor, tmp_path / "a")
    )
    swap_vision_tower(llava, vit_tower())
    vit_processor = ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    new_processor = llava_processor_for(llava, processor, vit_processor)
    assert type(new_processor.image_processor) is ViTImageProcessorPil
    with pytest.raises(UserError, match="gives 32x32 images but the tower takes 16x16"):
        llava_processor_for(llava, processor, ViTImageProcessorPil(size={"height": 32, "width": 32}))

    save_llava(llava, tmp_path / "llava", new_processor)
    with safe_open(tmp_path / "llava" / "model.safetensors", "pt") as weights:  # the key names 4.x reads
        assert "vision_tower.encoder.layer.0.attention.attention.query.weight" in weights.keys()
    reloaded = LlavaForConditionalGeneration.from_pretrained(tmp_path / "llava").to(device).eval()
    batch = _batch(AutoProcessor.from_pretrained(tmp_path / "llava"), shapes["image"][:2], device)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(**batch).logits, llava.to(device).eval()(**batch).logits, rtol=0, atol=0
        )


def test_load_vision_tower_takes_the_tower_of_dual_encoders_and_refuses_other_models(tmp_path):
    clip = tiny_clip(image_size=IMAGE_SIZE, seed=5)
    clip.save_pretrained(tmp_path / "clip")
    tower = load_vision_tower(tmp_path / "clip")
    assert type(tower) is CLIPVisionModel
    torch.testing.assert_close(tower.state_dict(), clip.vision_model.state_dict(), rtol=0, atol=0)

    vision = _small() | {"image_size": IMAGE_SIZE, "patch_size": 4}
    diffclip = DiffCLIPModel(DiffCLIPConfig(vision_config=vision, text_config=_small() | {"vocab_size": 100}))
    diffclip.save_pretrained(tmp_path / "diffclip")
    tower = load_vision_tower(tmp_path / "diffclip")
    assert type(tower) is DiffCLIPVisionModel
    torch.testing.assert_close(tower.state_dict(), diffclip.vision_model.state_dict(), rtol=0, atol=0)

    dcr = DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=5)
    dcr.save_pretrained(tmp_path / "dcr-model")  # DCR's full model (tower + projector): its tower is taken
    tower = load_vision_tower(tmp_path / "dcr-model")
    assert type(tower) is CLIPVisionModel
    torch.testing.assert_close(tower.state_dict(), clip.vision_model.state_dict(), rtol=0, atol=0)

    with_projection = CLIPVisionModelWithProjection(clip.config.vision_config)
    assert as_vision_tower(with_projection) is with_projection.vision_model

    CLIPTextModel(clip.config.text_config).save_pretrained(tmp_path / "text")
    with pytest.raises(UserError, match="CLIPTextModel is not a vision tower"):
        load_vision_tower(tmp_path / "text")
    with pytest.raises(UserError, match="not a transformers model folder"):
        load_vision_tower(tmp_path / "missing")


def _small() -> dict:
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


def _save_llava_checkpoint(tokenizer, processor, folder, dtype=torch.float32):
    llava = tiny_llava(tokenizer).to(dtype)
    llava.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def test_export_llava_writes_a_checkpoint_plain_transformers_reloads(tokenizer, processor, shapes, tmp_path):
    """A float16 LLaVA stays float16; tower keys are written in the layout transformers 4.x and 5.x read."""
    llava_dir = _save_llava_checkpoint(tokenizer, processor, tmp_path / "llava", torch.float16)
    tower_dir = _dcr_export(tmp_path / "tower")
    out = tmp_path / "out"
    assert export_main(["--llava", str(llava_dir), "--vision", str(tower_dir), "--output", str(out)]) == 0
    mask = os.umask(0o022)
    os.umask(mask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask  # the umask's (issue 37)

    reloaded = LlavaForConditionalGeneration.from_pretrained(out).eval()
    expected = LlavaForConditionalGeneration.from_pretrained(llava_dir).eval()
    swap_vision_tower(expected, load_vision_tower(tower_dir))
    assert module_dtype(reloaded) == torch.float16
    torch.testing.assert_close(reloaded.state_dict(), expected.state_dict(), rtol=0, atol=0)
    with safe_open(out / "model.safetensors", "pt") as weights:
        keys = list(weights.keys())
    assert "vision_tower.vision_model.embeddings.patch_embedding.weight" in keys
    assert not any(key.startswith("vision_tower.embeddings.") for key in keys)

    reloaded_processor = AutoProcessor.from_pretrained(out)
    assert (reloaded_processor.patch_size, reloaded_processor.num_additional_image_tokens) == (4, 1)
    batch = _batch(reloaded_processor, shapes["image"][:2], "cpu", torch.float16)
    torch.testing.assert_close(_generate(reloaded, batch), _generate(expected, batch), rtol=0, atol=0)


def test_export_llava_writes_a_processor_every_supported_transformers_reads(tokenizer, processor, tmp_path):
    """transformers 5 saves its generic tokenizer as `TokenizersBackend`, a class 4.x does not know, and
    keeps the loading options of the machine that saved it; the export names it `PreTrainedTokenizerFast`
    (what both resolve) and drops them. (Loaded on each release: tests/hub/test_load_back.py, slow.)"""
    llava_dir = _save_llava_checkpoint(tokenizer, processor, tmp_path / "llava")
    out = tmp_path / "out"
    assert (
        export_main(
            ["--llava", str(llava_dir), "--vision", str(_dcr_export(tmp_path / "t")), "--output", str(out)]
        )
        == 0
    )
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not {"is_local", "local_files_only", "cache_dir"} & set(saved)
    inputs = {"text": f"USER: {IMAGE_TOKEN}\nWhat is it? ASSISTANT:", "images": Image.new("RGB", (20, 20))}
    expected = processor(**inputs, return_tensors="pt").input_ids  # LLaVA expands the image token
    torch.testing.assert_close(
        AutoProcessor.from_pretrained(out)(**inputs, return_tensors="pt").input_ids, expected
    )


def test_export_llava_refuses_a_tower_of_another_width_and_writes_nothing(tokenizer, processor, tmp_path):
    llava_dir = _save_llava_checkpoint(tokenizer, processor, tmp_path / "llava")
    diffclip_tower(hidden_size=48).save_pretrained(tmp_path / "tower")
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"hidden width.*hf-vrl llava-align"):
        export_main(["--llava", str(llava_dir), "--vision", str(tmp_path / "tower"), "--output", str(out)])
    assert not out.exists()
    with pytest.raises(
        UserError, match=r"is a 'diffclip_vision_model' model; give a LlavaForConditionalGeneration"
    ):
        export_main(
            ["--llava", str(tmp_path / "tower"), "--vision", str(tmp_path / "tower"), "--output", str(out)]
        )


def test_llava_commands_are_registered(capsys):
    assert COMMANDS["export-llava"][0] == "hf_vrl.integrations.llava_export"
    assert COMMANDS["llava-align"][0] == "hf_vrl.integrations.llava_align"
    for command in ("export-llava", "llava-align"):
        with pytest.raises(SystemExit) as done:
            cli_main([command, "--help"])
        assert done.value.code == 0
        assert "--vision-feature-select-strategy" in capsys.readouterr().out


REMOTE_LOAD = textwrap.dedent(
    """
    import importlib.abc, sys

    # hf_vrl is installed (editable) in this environment: make it unimportable, as on a user's machine.
    class RefuseHfVrl(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_vrl" or name.startswith("hf_vrl."):
                raise ImportError("hf_vrl must not be needed to load the remote code")

    sys.meta_path.insert(0, RefuseHfVrl())
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.set_num_threads(1)  # as the test process (tests/conftest.py)
    model_dir, inputs_path, outputs_path = sys.argv[1:4]
    model, info = AutoModelForImageTextToText.from_pretrained(
        model_dir, trust_remote_code=True, output_loading_info=True
    )
    assert not any(info.values()), info
    assert "hf_vrl" not in sys.modules
    tower = model.model.vision_tower
    assert type(tower).__module__.startswith("transformers_modules."), type(tower).__module__
    processor = AutoProcessor.from_pretrained(model_dir, trust_remote_code=True)
    inputs = torch.load(inputs_path)
    images = [Image.open(path) for path in sys.argv[4:]]
    batch = processor(images=images, text=["<image>"] * len(images), return_tensors="pt")
    assert torch.equal(batch["input_ids"], inputs["input_ids"])
    # torchvision (AutoProcessor's default backend where installed) resizes within one grey level of PIL
    torch.testing.assert_close(batch["pixel_values"], inputs["pixel_values"], rtol=0, atol=1.01 / 255 / 0.26)
    with torch.no_grad():
        logits = model.eval()(input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"]).logits
        generated = model.generate(input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"],
                                   max_new_tokens=4, min_new_tokens=4, do_sample=False)
    torch.save({"logits": logits, "generated": generated, "tower": type(tower).__name__}, outputs_path)
    """
)


def test_a_diffclip_llava_loads_with_remote_code_where_hf_vrl_is_not_installed(
    tokenizer, processor, shapes, tmp_path
):
    # loaded from a folder: the LLaVA remembers its CLIP tower's key renames, which must not reach DiffCLIP's
    llava = LlavaForConditionalGeneration.from_pretrained(
        _save_llava_checkpoint(tokenizer, processor, tmp_path / "a")
    )
    swap_vision_tower(llava, diffclip_tower())
    new_processor = llava_processor_for(llava, processor)
    out = save_llava(llava.eval(), tmp_path / "llava", new_processor)
    code = {"configuration_diffclip.py", "modeling_diffclip.py", "differential_attention.py"}
    assert {*code, "llava_remote_tower.py"} <= set(os.listdir(out))

    image_paths = [tmp_path / f"image{i}.png" for i in range(2)]
    for image, path in zip(shapes["image"][:2], image_paths):
        image.save(path)
    batch = new_processor(images=list(shapes["image"][:2]), text=[IMAGE_TOKEN] * 2, return_tensors="pt")
    torch.save(dict(batch), tmp_path / "inputs.pt")
    with torch.no_grad():
        logits = llava(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"]).logits
    generated = _generate(llava, {"input_ids": batch["input_ids"], "pixel_values": batch["pixel_values"]})
    # with hf_vrl imported its own classes serve the folder, with no remote code; a native tower swapped in
    # later drops the auto_map
    in_process = LlavaForConditionalGeneration.from_pretrained(out).eval()
    assert type(in_process.model.vision_tower) is DiffCLIPVisionModel
    swap_vision_tower(in_process, clip_tower())
    native = save_llava(in_process, tmp_path / "native")
    assert "auto_map" not in json.loads((native / "config.json").read_text())
    assert not (native / "llava_remote_tower.py").exists()

    script = tmp_path / "load.py"
    script.write_text(REMOTE_LOAD)
    env = {
        **os.environ,
        "PYTHONPATH": "",
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_HOME": str(tmp_path / "hf_home"),
    }
    args = [sys.executable, str(script), str(out), str(tmp_path / "inputs.pt"), str(tmp_path / "outputs.pt")]
    args += [str(path) for path in image_paths]
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = torch.load(tmp_path / "outputs.pt")
    assert loaded["tower"] == "DiffCLIPVisionModel"
    torch.testing.assert_close(loaded["logits"], logits, rtol=0, atol=0)
    torch.testing.assert_close(loaded["generated"], generated, rtol=0, atol=0)
