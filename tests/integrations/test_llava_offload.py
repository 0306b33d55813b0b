"""A LLaVA with a DiffCLIP vision tower runs under accelerate's offload: the tower on disk (device_map with an
offload folder) and everything offloaded to the CPU (weights on `meta` until each module's forward)."""

from __future__ import annotations

import pytest
import torch
from accelerate import cpu_offload
from llava_helpers import IMAGE_TOKEN, diffclip_tower
from transformers import LlavaForConditionalGeneration

from hf_vrl.integrations.llava import llava_processor_for, save_llava, swap_vision_tower


@pytest.fixture
def saved(llava, processor, shapes, tmp_path):
    swap_vision_tower(llava, diffclip_tower())
    with torch.no_grad():  # λ and the RMSNorm weights away from their init
        for name, parameter in llava.model.vision_tower.named_parameters():
            if "lambda_" in name or "diff_norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    new_processor = llava_processor_for(llava, processor)
    folder = save_llava(llava.eval(), tmp_path / "llava", new_processor)
    batch = new_processor(images=list(shapes["image"][:2]), text=[IMAGE_TOKEN] * 2, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "pixel_values": batch["pixel_values"]}
    with torch.no_grad():
        logits = llava(**inputs).logits
    return folder, inputs, logits


def _tower_on_disk(model: LlavaForConditionalGeneration) -> dict:
    names = [name for name, _ in model.named_children()]
    assert names[0] == "model"
    inner = [name for name, _ in model.model.named_children()]
    device_map = {f"model.{name}": "disk" if name == "vision_tower" else "cpu" for name in inner}
    return device_map | {name: "cpu" for name in names[1:]}


def test_a_diffclip_llava_runs_with_its_tower_offloaded_to_disk(saved, tmp_path):
    folder, inputs, logits = saved
    device_map = _tower_on_disk(LlavaForConditionalGeneration.from_pretrained(folder))
    loaded = LlavaForConditionalGeneration.from_pretrained(
        folder, device_map=device_map, offload_folder=tmp_path / "offload"
    ).eval()
    assert all(p.is_meta for p in loaded.model.vision_tower.parameters())
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, logits)


def test_a_diffclip_llava_runs_offloaded_to_the_cpu(saved):
    folder, inputs, logits = saved
    loaded = LlavaForConditionalGeneration.from_pretrained(folder).eval()
    cpu_offload(loaded, execution_device=torch.device("cpu"))
    assert all(p.is_meta for p in loaded.model.vision_tower.parameters())
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, logits)
