"""Train -> evaluate -> card -> stage (`publish(..., dry_run=True)`, the folder `upload_folder` would send) ->
load back: the code block of each staged card, run as a user would in a fresh interpreter where hf_vrl cannot
be imported, gives the trained model's outputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

import hf_vrl.models  # noqa: F401  (the expected outputs come from hf_vrl's own classes)
from hf_vrl.hub import publish

LABELS = ["a photo of a circle", "a photo of a square"]  # the labels of the cards' example
MODELS = [
    ("diffclip", "final"),
    ("diffclip-recoded", "final"),
    ("dcr", "final"),
    ("dcr", "vision-tower"),
    ("dcr", "dcr-model"),
    ("dive", "final"),
    ("dive", "vision-tower"),
    ("clue", "final"),
    ("clue", "backbone"),
]
FEATURES = {("dcr", "dcr-model"): "image_embeds", ("clue", "final"): "features"}  # else pooler_output

RUN_CARDS = """
import importlib.abc, json, re, sys
from pathlib import Path

class RefuseHfVrl(importlib.abc.MetaPathFinder):  # hf_vrl is installed (editable) here, not at a user's
    def find_spec(self, name, path=None, target=None):
        if name == "hf_vrl" or name.startswith("hf_vrl."):
            raise ImportError("hf_vrl must not be needed to load a published model")

sys.meta_path.insert(0, RefuseHfVrl())

results = {}
for repo_id, folder in json.loads(sys.argv[1]).items():
    card = Path(folder, "README.md").read_text()
    code = re.search(r"```python\\n(.*?)```", card, re.S).group(1)
    scope = {}
    exec(code.replace(f'"{repo_id}"', repr(folder)), scope)
    output = scope["logits"] if "logits" in scope else scope["features"]
    results[repo_id] = {"output": output.tolist(), "class": type(scope["model"]).__name__}
results["hf_vrl imported"] = "hf_vrl" in sys.modules
Path("results.json").write_text(json.dumps(results))
"""


def _expected(run, method, what, image) -> torch.Tensor:
    """What the run's model gives for the card's example, loaded in this process with hf_vrl's classes (the
    processors are the run's, in final/)."""
    model = AutoModel.from_pretrained(run / "final" if what == "final" else run / "exports" / what).eval()
    pixels = AutoImageProcessor.from_pretrained(run / "final")(images=image, return_tensors="pt").pixel_values
    with torch.no_grad():
        if what == "final" and (run / "final" / "tokenizer_config.json").is_file():
            text = AutoTokenizer.from_pretrained(run / "final")(LABELS, padding=True, return_tensors="pt")
            return model(pixel_values=pixels, **text).logits_per_image
        return getattr(model(pixel_values=pixels), FEATURES.get((method, what), "pooler_output"))


def _without_code(run, tmp_path):
    """A copy of the DiffCLIP run whose final/ was saved without remote code (no .py files, no auto_map)."""
    copy = shutil.copytree(run, tmp_path / "no-code", ignore=shutil.ignore_patterns("checkpoints", "*.py"))
    config = json.loads((copy / "final/config.json").read_text())
    del config["auto_map"]
    (copy / "final/config.json").write_text(json.dumps(config))
    return copy


def test_published_models_load_back_from_their_cards(diffclip_run, dcr_run, dive_run, clue_run, tmp_path):
    runs = {
        "diffclip": diffclip_run,
        "dcr": dcr_run,
        "dive": dive_run,
        "clue": clue_run,
        "diffclip-recoded": _without_code(diffclip_run, tmp_path),
    }
    repos = {}
    for method, what in MODELS:
        repo_id = f"me/{method}-{what}"
        staged = publish(runs[method], repo_id, what=what, dry_run=True, staging_dir=tmp_path / repo_id)
        repos[repo_id] = str(staged.staging_dir)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    image.save(tmp_path / "photo.jpg")
    env = {
        **os.environ,
        "PYTHONPATH": "",
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_HOME": str(tmp_path / "hf_home"),
    }
    done = subprocess.run(
        [sys.executable, "-c", RUN_CARDS, json.dumps(repos)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results.pop("hf_vrl imported") is False
    assert {repo: r["class"] for repo, r in results.items()} == {
        "me/diffclip-final": "DiffCLIPModel",  # the repo's own code, without hf_vrl
        "me/diffclip-recoded-final": "DiffCLIPModel",  # the code publish supplied
        "me/dcr-final": "CLIPModel",
        "me/dcr-vision-tower": "CLIPVisionModel",
        "me/dcr-dcr-model": "DCRModel",
        "me/dive-final": "CLIPModel",
        "me/dive-vision-tower": "CLIPVisionModel",
        "me/clue-final": "CLUEModel",  # the repo's own code, without hf_vrl
        "me/clue-backbone": "ResNetModel",
    }
    photo = Image.open(tmp_path / "photo.jpg").convert("RGB")
    for method, what in MODELS:
        expected = _expected(runs[method], method, what, photo)
        got = torch.tensor(results[f"me/{method}-{what}"]["output"])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
