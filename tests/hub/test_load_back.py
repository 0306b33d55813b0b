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
import pytest
import torch
import transformers
from PIL import Image
from remote_code import FRESH_START, TRANSFORMERS_RELEASES, run_fresh, transformers_environment
from transformers import AutoImageProcessor, AutoModel, AutoProcessor, AutoTokenizer, CLIPImageProcessorPil

import hf_vrl.models  # noqa: F401  (the expected outputs come from hf_vrl's own classes)
from hf_vrl.hub import publish
from hf_vrl.presets import preset_path

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


def run_in_fresh_process(script: str, args: list[str], folder) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter, in `folder` with a random `photo.jpg` (the cards' example image): the
    Hub offline, module and Hub caches of its own, stdin closed (a remote-code prompt would fail)."""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    image.save(folder / "photo.jpg")
    env = {
        **os.environ,
        "PYTHONPATH": "",
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(folder / "modules"),
        "HF_HOME": str(folder / "hf_home"),
    }
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip


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
    done = run_in_fresh_process(RUN_CARDS, [json.dumps(repos)], tmp_path)
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


RUN_LINES = """
import importlib.abc, json, re, sys
from pathlib import Path

class RefuseHfVrl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "hf_vrl" or name.startswith("hf_vrl."):
            raise ImportError("hf_vrl must not be needed to load a published model")

sys.meta_path.insert(0, RefuseHfVrl())
import transformers
from PIL import Image

repos, zero_shot = json.loads(sys.argv[1]), sys.argv[2]
results = {"lines": {}}
for repo_id, folder in repos.items():
    card = Path(folder, "README.md").read_text()
    for line in sorted(set(re.findall(r"\\b(Auto\\w+\\.from_pretrained\\([^`\\n]*?\\))", card))):
        scope = {line.split(".", 1)[0]: getattr(transformers, line.split(".", 1)[0])}
        loaded = eval(line.replace(f'"{repo_id}"', repr(folder)), scope)
        results["lines"][f"{repo_id}: {line}"] = type(loaded).__name__
classifier = transformers.pipeline(
    "zero-shot-image-classification", model=repos[zero_shot], trust_remote_code=True
)
scores = classifier(Image.open("photo.jpg"), candidate_labels=["a photo of a circle", "a photo of a square"])
results["pipeline"] = {"model": type(classifier.model).__name__, "scores": scores}
processor = transformers.AutoProcessor.from_pretrained(repos[zero_shot], trust_remote_code=True)
results["processor"] = type(processor).__name__
results["hf_vrl imported"] = "hf_vrl" in sys.modules
Path("lines.json").write_text(json.dumps(results))
"""


def test_every_loading_line_of_the_cards_and_the_zero_shot_pipeline_run_without_hf_vrl(
    diffclip_run, dcr_run, clue_run, tmp_path
):
    """Each `Auto*.from_pretrained(...)` a card prints (the exports' lines with `subfolder=` included) runs
    as printed, and DiffCLIP serves the zero-shot pipeline and AutoProcessor, where hf_vrl cannot be
    imported, with no prompt for remote code (stdin is closed: a prompt would fail the line)."""
    published = {
        "me/diffclip": publish(diffclip_run, "me/diffclip", dry_run=True, staging_dir=tmp_path / "diffclip"),
        "me/dcr": publish(
            dcr_run,
            "me/dcr",
            exports=["dcr-model", "vision-tower"],
            dry_run=True,
            staging_dir=tmp_path / "dcr",
        ),
        "me/clue": publish(
            clue_run, "me/clue", exports=["backbone"], dry_run=True, staging_dir=tmp_path / "c"
        ),
    }
    repos = {repo: str(p.staging_dir) for repo, p in published.items()}
    done = run_in_fresh_process(RUN_LINES, [json.dumps(repos), "me/diffclip"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "lines.json").read_text())
    assert results["hf_vrl imported"] is False
    lines = results["lines"]
    export_line = 'AutoModel.from_pretrained("me/dcr", subfolder="exports/dcr-model", trust_remote_code=True)'
    assert lines[f"me/dcr: {export_line}"] == "DCRModel"
    assert "AutoTokenizer" in " ".join(lines) and "CLIPTokenizer" in set(lines.values())
    assert results["pipeline"]["model"] == "DiffCLIPModel"
    scores = results["pipeline"]["scores"]
    assert {s["label"] for s in scores} == {"a photo of a circle", "a photo of a square"}
    assert abs(sum(s["score"] for s in scores) - 1) < 1e-5
    assert results["processor"] == "CLIPProcessor"


def test_staged_files_carry_no_machine_state(diffclip_run, clue_run, tmp_path):
    diffclip = publish(
        diffclip_run, "me/diffclip", dry_run=True, staging_dir=tmp_path / "diffclip"
    ).staging_dir
    tokenizer_config = json.loads((diffclip / "tokenizer_config.json").read_text())
    assert not {"local_files_only", "is_local", "cache_dir"} & set(tokenizer_config)
    assert tokenizer_config["tokenizer_class"] == "CLIPTokenizer"
    clue = publish(clue_run, "me/clue", dry_run=True, staging_dir=tmp_path / "clue").staging_dir
    config = json.loads((clue / "config.json").read_text())
    assert not str(config["backbone_config"].get("_name_or_path", "")).startswith(("runs", "/", "."))
    assert str(tmp_path.parent) not in json.dumps(config)


# Every folder hf_vrl writes for others to load, opened as its card says (the Auto class, remote code where it
# has some) with its processor by `AutoProcessor`, on every transformers release the README names.
LOAD_ON_RELEASE = (
    FRESH_START
    + """
import json
import transformers
from PIL import Image

cases, out = json.loads(open(sys.argv[1]).read()), sys.argv[2]
image = Image.open("photo.png").convert("RGB")
results = {"transformers": transformers.__version__, "hf_vrl imported": False}
for name, case in cases.items():
    model = getattr(transformers, case["auto"]).from_pretrained(case["folder"], trust_remote_code=True)
    processor = transformers.AutoProcessor.from_pretrained(case["folder"], trust_remote_code=True)
    text = {"text": case["text"], "padding": True} if case["text"] else {}
    processed = processor(images=[image], return_tensors="pt", **text)
    with torch.no_grad():
        outputs = model.eval()(**torch.load(case["inputs"]))
    results[name] = {
        "model": type(model).__name__,
        "input_ids": processed["input_ids"] if "input_ids" in processed else None,
        "pixels": tuple(processed["pixel_values"].shape),
        "outputs": {key: value for key, value in outputs.items() if torch.is_tensor(value)},
    }
results["hf_vrl imported"] = "hf_vrl" in sys.modules
torch.save(results, out)
"""
)
TEXTS = {"clip": LABELS, "llava": ["USER: <image>\nWhat is it? ASSISTANT:"]}


def _llava_exports(tmp_path) -> dict:
    """`hf-vrl export-llava` of a tiny LLaVA with a CLIP tower (as DCR / DiVE export it) and with a DiffCLIP
    tower (remote code)."""
    from llava_helpers import clip_tower, diffclip_tower, tiny_llava, tiny_processor, toy_tokenizer

    from hf_vrl.integrations.llava_export import main as export_llava

    tokenizer = toy_tokenizer()
    tiny_llava(tokenizer).save_pretrained(tmp_path / "llava")
    tiny_processor(tokenizer).save_pretrained(tmp_path / "llava")
    folders = {}
    for name, tower in (("llava-clip", clip_tower()), ("llava-diffclip", diffclip_tower())):
        tower.save_pretrained(tmp_path / f"{name}-tower")
        argv = ["--llava", str(tmp_path / "llava"), "--vision", str(tmp_path / f"{name}-tower")]
        assert export_llava([*argv, "--output", str(tmp_path / name)]) == 0
        folders[name] = (tmp_path / name, "AutoModelForImageTextToText", "llava")
    return folders


def _converted(tmp_path):
    """`hf-vrl convert diffclip` of a tiny CLIP folder with its processors."""
    from hf_vrl.cli import main as cli
    from hf_vrl.methods.dcr.toy import tiny_clip

    clip = tmp_path / "clip"
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    tiny_clip(image_size=16, vocab_size=len(tokenizer)).save_pretrained(clip)
    tokenizer.save_pretrained(clip)
    square = {"height": 16, "width": 16}
    CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size=square).save_pretrained(clip)
    out = tmp_path / "converted"
    argv = ["convert", "diffclip", "--clip", str(clip), "--output", str(out), "--calibration", "synthetic"]
    assert cli(argv) == 0
    return out


@pytest.fixture(scope="module")
def written(diffclip_run, dcr_run, dive_run, clue_run, tmp_path_factory):
    """{name: (folder, Auto class, text kind)} of every folder the runs, export-llava and convert write, with
    the inputs of its model (from its processor here) and the outputs hf_vrl's classes give."""
    root = tmp_path_factory.mktemp("written")
    folders = {}
    for method, run in (("diffclip", diffclip_run), ("dcr", dcr_run), ("dive", dive_run), ("clue", clue_run)):
        text = "clip" if (run / "final" / "tokenizer_config.json").is_file() else None
        folders[f"{method}-final"] = (run / "final", "AutoModel", text)
        for export in sorted((run / "exports").iterdir()) if (run / "exports").is_dir() else ():
            folders[f"{method}-{export.name}"] = (export, "AutoModel", None)
    folders |= _llava_exports(root) | {"convert": (_converted(root), "AutoModel", "clip")}
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    cases, expected = {}, {}
    for name, (folder, auto, kind) in folders.items():
        processor = AutoProcessor.from_pretrained(folder)
        text = {"text": TEXTS[kind], "padding": True} if kind else {}
        inputs = dict(processor(images=[photo], return_tensors="pt", **text))
        torch.save(inputs, root / f"{name}.pt")
        model = getattr(transformers, auto).from_pretrained(folder).eval()
        with torch.no_grad():
            outputs = model(**inputs)
        expected[name] = (inputs, {k: v for k, v in outputs.items() if torch.is_tensor(v)})
        cases[name] = {"folder": str(folder), "auto": auto, "text": TEXTS[kind] if kind else None}
        cases[name]["inputs"] = str(root / f"{name}.pt")
    (root / "cases.json").write_text(json.dumps(cases))
    return root, expected


@pytest.mark.slow
@pytest.mark.parametrize("version", TRANSFORMERS_RELEASES)
def test_every_folder_hf_vrl_writes_loads_with_its_processor_on_every_release(written, version):
    """final/ and exports/ of every method, `hf-vrl export-llava` (CLIP and DiffCLIP towers) and `hf-vrl
    convert`: model and processor load in a fresh process without hf_vrl, on transformers `version`; the
    processor gives the inputs this one gives (the same token ids) and the model the same outputs."""
    root, expected = written
    work = root / version
    work.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(
        work / "photo.png"
    )
    run_fresh(
        LOAD_ON_RELEASE,
        [str(root / "cases.json"), str(work / "out.pt")],
        work,
        transformers_environment(version),
    )
    results = torch.load(work / "out.pt")
    assert results.pop("transformers") == version and results.pop("hf_vrl imported") is False
    assert results.keys() == expected.keys()
    for name, (inputs, outputs) in expected.items():
        got = results[name]
        assert got["pixels"] == tuple(inputs["pixel_values"].shape), name
        if "input_ids" in inputs:
            torch.testing.assert_close(got["input_ids"], inputs["input_ids"], msg=name)
        assert got["outputs"].keys() >= outputs.keys(), name  # 4.57's LLaVA adds image_hidden_states
        for key, value in outputs.items():
            torch.testing.assert_close(got["outputs"][key], value, rtol=1e-5, atol=1e-6, msg=f"{name}.{key}")
