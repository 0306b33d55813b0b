"""DiffCLIP, DCR and CLUE saved with the installed transformers load as remote code, in a fresh interpreter
without hf_vrl, on every transformers release users have, and give identical outputs; their
get_image_features (and DiffCLIP's get_text_features) return what that release's CLIPModel's return (a
tensor on 4.57, a BaseModelOutputWithPooling on 5.x), whose embedding is the forward's (DiffCLIP's once
normalised).

Slow: each environment (transformers and its dependencies, from the package index, no Hub) is built once with
`pip install --target` into ~/.cache/hf_vrl/transformers-compat/<version> (HF_VRL_COMPAT_CACHE to move it)
and reused; the child runs this torch with that folder first on PYTHONPATH.
"""

import pytest
import torch
from clue_helpers import TINY_HEADS, TINY_RESNET
from remote_code import TRANSFORMERS_RELEASES, remote_load, transformers_environment
from test_diffclip_reference import text_batch, tiny_config_kwargs

from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.clue import CLUEConfig, CLUEModel
from hf_vrl.models.dcr import DCRModel
from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPModel

# the forward's output each get_*_features embedding is (DiffCLIP's forward normalises its embeddings)
FEATURE_OUTPUTS = {
    "diffclip": {"image": "image_embeds", "text": "text_embeds"},
    "dcr": {"image": "image_embeds"},
    "clue": {"image": "features"},
}


def saved_models(root):
    """A DiffCLIP (DiffCLIP† text tower, DiffCLIP* vision schedule), a DCR and a CLUE model (ResNet
    backbone, parts, text head, momentum branch) saved with this transformers, each with inputs and the
    outputs computed here."""
    torch.manual_seed(0)
    diffclip = DiffCLIPModel(
        DiffCLIPConfig(
            **tiny_config_kwargs(
                diff_attention_in_text=False, vision_config={"lambda_init_schedule": "depth"}
            )
        )
    ).eval()
    input_ids, attention_mask = text_batch()
    diffclip_inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "pixel_values": torch.randn(3, 3, 16, 16),
    }
    dcr = DCRModel.from_clip(tiny_clip().eval(), condition_dim=16, num_condition_tokens=5).eval()
    dcr.set_null_text_embeds(torch.randn(1, 5, 16))
    dcr_inputs = {"pixel_values": torch.rand(2, 3, 16, 16)}
    clue = CLUEModel(CLUEConfig(backbone_config=dict(TINY_RESNET), text_embed_dim=8, **TINY_HEADS)).eval()
    clue_inputs = {"pixel_values": torch.rand(2, 3, 16, 16)}
    cases = {}
    models = (("diffclip", diffclip, diffclip_inputs), ("dcr", dcr, dcr_inputs), ("clue", clue, clue_inputs))
    for name, model, inputs in models:
        model.save_pretrained(root / name)
        with torch.no_grad():
            expected = {key: value for key, value in model(**inputs).items() if torch.is_tensor(value)}
        cases[name] = (root / name, inputs, expected, type(model).__name__)
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("version", TRANSFORMERS_RELEASES)
def test_remote_code_loads_identically_on_transformers(version, tmp_path):
    environment = transformers_environment(version)
    for name, (model_dir, inputs, expected, class_name) in saved_models(tmp_path).items():
        loaded = remote_load(model_dir, inputs, tmp_path / f"{name}-child", environment)
        assert loaded["transformers"] == version and loaded["cls"] == class_name
        assert loaded["outputs"].keys() == expected.keys(), name
        for key, value in expected.items():
            torch.testing.assert_close(loaded["outputs"][key], value, rtol=0, atol=0, msg=f"{name}.{key}")
        features = loaded["features"]
        assert features.keys() == FEATURE_OUTPUTS[name].keys(), name
        for side, (ours, clips, embedding) in features.items():
            assert ours == clips, f"{name}.get_{side}_features returns {ours} where CLIPModel's gives {clips}"
            normalised = torch.nn.functional.normalize(embedding, dim=-1)
            reference = torch.nn.functional.normalize(expected[FEATURE_OUTPUTS[name][side]], dim=-1)
            torch.testing.assert_close(normalised, reference, msg=f"{name}.{side}")
