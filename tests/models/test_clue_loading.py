"""CLUE loading: remote code in a fresh interpreter without hf_vrl (ResNet and ViT backbones), the registered
Auto classes, and the exported backbone as a stock transformers model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from test_clue_model import TINY_RESNET, TINY_VIT, tiny
from transformers import AutoConfig, AutoModel, ResNetModel, ViTModel

import hf_vrl.models  # noqa: F401 - registers the Auto classes
from hf_vrl.methods.clue.export import export_backbone
from hf_vrl.models.clue import CLUEConfig, CLUEModel

FRESH_LOAD = textwrap.dedent(
    """
    import importlib.abc, json, sys

    # hf_vrl is installed (editable) in this environment: make it unimportable, as on a user's machine.
    class RefuseHfVrl(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_vrl" or name.startswith("hf_vrl."):
                raise ImportError("hf_vrl must not be needed to load the model")

    sys.meta_path.insert(0, RefuseHfVrl())
    import torch
    from transformers import AutoModel

    torch.set_num_threads(1)  # as the test process (conftest)
    for job in json.loads(open(sys.argv[1]).read()):
        remote = job["mode"] == "remote"
        model = AutoModel.from_pretrained(job["dir"], trust_remote_code=remote).eval()
        pixel_values = torch.load(job["inputs"])
        with torch.no_grad():
            if remote:
                out = model(pixel_values)
                momentum = [p for n, p in model.named_parameters() if n.startswith("momentum_")]
                result = {"embeddings": out.embeddings, "parts": out.part_descriptors}
                result["frozen"] = bool(momentum) and not any(p.requires_grad for p in momentum)
            else:
                result = {"last_hidden_state": model(pixel_values=pixel_values).last_hidden_state}
        result.update(cls=type(model).__name__, module=type(model).__module__)
        torch.save(result, job["outputs"])
    assert "hf_vrl" not in sys.modules, sorted(m for m in sys.modules if m.startswith("hf_vrl"))
    """
)
CASES = {"resnet": (TINY_RESNET, 32, ResNetModel), "vit": (TINY_VIT, 16, ViTModel)}


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    """Save a CLUE model and its exported backbone per backbone kind, load all four in one fresh interpreter
    (same torch thread settings), return {(kind, mode): (loaded outputs, expected outputs, folder)}."""
    root = tmp_path_factory.mktemp("fresh")
    jobs, expected = [], {}
    for kind, (backbone, size, _) in CASES.items():
        model = tiny(backbone, text_embed_dim=12).eval()
        with torch.no_grad():
            for param in model.backbone.parameters():
                param.add_(0.01)  # "trained": the export must carry the online weights, not the initial ones
            views, images = torch.randn(3, 2, 3, size, size), torch.randn(2, 3, size, size)
            expected[kind, "remote"] = model(views)
            expected[kind, "stock"] = model.backbone(pixel_values=images)
        model.save_pretrained(root / f"{kind}-model")
        export_backbone(model, root / f"{kind}-backbone")
        for mode, folder, inputs in (
            ("remote", f"{kind}-model", views),
            ("stock", f"{kind}-backbone", images),
        ):
            torch.save(inputs, root / f"{kind}-{mode}-in.pt")
            jobs.append(
                {"dir": str(root / folder), "mode": mode, "inputs": str(root / f"{kind}-{mode}-in.pt")}
            )
            jobs[-1]["outputs"] = str(root / f"{kind}-{mode}-out.pt")
    (root / "jobs.json").write_text(json.dumps(jobs))
    (root / "load.py").write_text(FRESH_LOAD)
    env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(root / "modules")}
    env["HF_HOME"] = str(root / "hf_home")
    args = [sys.executable, str(root / "load.py"), str(root / "jobs.json")]
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        (kind, mode): (torch.load(root / f"{kind}-{mode}-out.pt"), expected[kind, mode], root)
        for kind in CASES
        for mode in ("remote", "stock")
    }


@pytest.mark.parametrize("kind", CASES)
def test_fresh_process_loads_the_remote_code_identically(fresh_process, kind):
    loaded, expected, root = fresh_process[kind, "remote"]
    files = set(os.listdir(root / f"{kind}-model"))
    assert {"config.json", "model.safetensors", "configuration_clue.py", "modeling_clue.py"} <= files
    config = json.loads((root / f"{kind}-model" / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_clue.CLUEConfig",
        "AutoModel": "modeling_clue.CLUEModel",
    }
    assert config["model_type"] == "clue" and config["backbone_config"]["model_type"] == kind
    assert loaded["cls"] == "CLUEModel" and loaded["module"].startswith("transformers_modules.")
    assert loaded["frozen"]
    torch.testing.assert_close(loaded["embeddings"], expected.embeddings, rtol=0, atol=0)
    torch.testing.assert_close(loaded["parts"], expected.part_descriptors, rtol=0, atol=0)


def test_registered_auto_classes_need_no_remote_code(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is CLUEConfig
    assert type(AutoModel.from_pretrained(tmp_path)) is CLUEModel


@pytest.mark.parametrize("kind", CASES)
def test_exported_backbone_is_a_stock_model(fresh_process, kind):
    loaded, expected, root = fresh_process[kind, "stock"]
    config = json.loads((root / f"{kind}-backbone" / "config.json").read_text())
    assert "auto_map" not in config and config["model_type"] == kind
    assert loaded["cls"] == CASES[kind][2].__name__ and loaded["module"].startswith("transformers.models.")
    torch.testing.assert_close(loaded["last_hidden_state"], expected.last_hidden_state, rtol=0, atol=0)


def test_export_refuses_other_models(tmp_path):
    with pytest.raises(TypeError, match="CLUEModel"):
        export_backbone(torch.nn.Linear(2, 2), tmp_path / "nothing")
