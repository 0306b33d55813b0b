"""The paper's other settings as presets: ViT-L/14 (Table 8, B' = 256) and iWildCam / FMoW (Table 11)."""

import pytest

from hf_vrl.methods.dive.method import DiVERunConfig
from hf_vrl.presets import load_preset
from hf_vrl.run.config import resolve


def config(name):
    return resolve(DiVERunConfig, load_preset(name), source=name)


def test_vit_l14_preset_is_table_8():
    c = config("dive-l14")
    assert c.model.pretrained == "openai/clip-vit-large-patch14"
    assert c.optim.global_batch_size == 512 and c.dive.reference_batch_size == 256
    assert (c.optim.learning_rate, c.optim.weight_decay, c.optim.num_train_epochs) == (1e-5, 0.1, 10)
    assert c.dive.lambda_dive == 1000.0 and c.dive.alpha == 0.99
    assert any("75.2" in note for note in load_preset("dive-l14")["notes"])


@pytest.mark.parametrize("name", ["dive-iwildcam-b16", "dive-fmow-b16"])
def test_wilds_presets_are_table_11(name):
    c = config(name)
    assert c.optim.global_batch_size == 256 and c.dive.reference_batch_size == 256
    assert (c.optim.learning_rate, c.optim.weight_decay, c.optim.num_train_epochs) == (3e-5, 0.2, 20)
    assert c.optim.warmup_steps == 500 and c.optim.lr_scheduler == "cosine"
    assert c.dive.templates and all(t.count("{}") == 1 for t in c.dive.templates)
    assert len(c.dive.ood_datasets) == 1 and c.dive.crop_scale == [0.9, 1.0]
    metric = "macro_f1" if "iwildcam" in name else "worst_group_accuracy"
    assert any(metric in note for note in load_preset(name)["notes"])
