"""Load a saved model folder as Hub remote code in a fresh interpreter where hf_vrl cannot be imported, with
a chosen transformers (an environment folder put first on PYTHONPATH) and the parent's torch thread settings,
and return its outputs; used by the DiffCLIP / DCR loading tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# The start of every child script: hf_vrl is installed (editable) in this environment, so it is made
# unimportable, as on a user's machine; torch takes the parent's thread counts (its last two arguments), so
# that reductions split the same way and outputs compare exactly.
FRESH_START = """
import importlib.abc, sys

class RefuseHfVrl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "hf_vrl" or name.startswith("hf_vrl."):
            raise ImportError("hf_vrl must not be needed to load the remote code")

sys.meta_path.insert(0, RefuseHfVrl())
import torch

torch.set_num_threads(int(sys.argv[-2]))
torch.set_num_interop_threads(int(sys.argv[-1]))
"""

REMOTE_LOAD = (
    FRESH_START
    + """
import transformers
from transformers import AutoModel

model_dir, inputs_path, outputs_path = sys.argv[1:4]
model = AutoModel.from_pretrained(model_dir, trust_remote_code=True).eval()
assert "hf_vrl" not in sys.modules, sorted(m for m in sys.modules if m.startswith("hf_vrl"))
assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
with torch.no_grad():
    out = model(**torch.load(inputs_path))
outputs = {key: value for key, value in out.items() if torch.is_tensor(value)}
result = {"outputs": outputs, "cls": type(model).__name__, "transformers": transformers.__version__}
result["threads"] = (torch.get_num_threads(), torch.get_num_interop_threads())
if hasattr(model, "get_image_features"):  # its feature methods against this release's CLIPModel's
    from transformers import CLIPConfig, CLIPModel

    inputs = torch.load(inputs_path)
    tiny = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    vocab_size = getattr(getattr(model.config, "text_config", None), "vocab_size", 64)
    text = {**tiny, "vocab_size": vocab_size}
    vision = {**tiny, "image_size": inputs["pixel_values"].shape[-1], "patch_size": 8}
    clip = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).eval()
    calls = {"image": {"pixel_values": inputs["pixel_values"]}}
    if hasattr(model, "get_text_features"):  # a dual encoder
        calls["text"] = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    result["features"] = {}
    with torch.no_grad():
        for name, kwargs in calls.items():
            ours = getattr(model, f"get_{name}_features")(**kwargs)
            theirs = getattr(clip, f"get_{name}_features")(**kwargs)
            embedding = ours if torch.is_tensor(ours) else ours.pooler_output
            result["features"][name] = (type(ours).__name__, type(theirs).__name__, embedding)
torch.save(result, outputs_path)
"""
)

# The releases the README names: 4.57 the last 4.x (what most LLaVA code pins), 5.0 the oldest 5.x, 5.17 the
# GPU image's, 5.23 the newest when they were chosen (the development environment's runs every other test).
TRANSFORMERS_RELEASES = ("4.57.6", "5.0.0", "5.17.0", "5.23.0")

# Where the transformers environments of the version-matrix test are kept between runs.
COMPAT_CACHE = Path(
    os.environ.get("HF_VRL_COMPAT_CACHE", Path.home() / ".cache" / "hf_vrl" / "transformers-compat")
)


def run_fresh(script: str, args: list[str], work_dir: Path, environment: Path | None = None) -> None:
    """`script` (starting with FRESH_START) with `args` in a fresh interpreter in `work_dir`: transformers
    from `environment` (first on PYTHONPATH) when given, else the installed one; the Hub offline, module and
    Hub caches of its own; this process's torch thread counts. Asserts it succeeds."""
    work_dir.mkdir(parents=True, exist_ok=True)
    script_file = work_dir / "script.py"
    script_file.write_text(script)
    env = {
        **os.environ,
        "PYTHONPATH": str(environment or ""),
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(work_dir / "modules"),
        "HF_HOME": str(work_dir / "hf_home"),
    }
    threads = [str(torch.get_num_threads()), str(torch.get_num_interop_threads())]
    command = [sys.executable, str(script_file), *args, *threads]
    done = subprocess.run(command, cwd=work_dir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def remote_load(model_dir: Path, inputs: dict, work_dir: Path, environment: Path | None = None) -> dict:
    """Run `AutoModel.from_pretrained(model_dir, trust_remote_code=True)(**inputs)` in a fresh interpreter
    (`run_fresh`); returns {"outputs": tensor fields, "cls": class name, "transformers": version, "threads":
    the child's (intra-op, inter-op) thread counts}, and for a model with `get_image_features` "features":
    {"image" (and "text" for a dual encoder): (the type its get_*_features returns, the type that release's
    CLIPModel's returns, the embedding)}."""
    work_dir.mkdir(parents=True, exist_ok=True)
    torch.save(inputs, work_dir / "inputs.pt")
    run_fresh(
        REMOTE_LOAD,
        [str(model_dir), str(work_dir / "inputs.pt"), str(work_dir / "out.pt")],
        work_dir,
        environment,
    )
    return torch.load(work_dir / "out.pt")


def transformers_environment(version: str) -> Path:
    """A folder holding `transformers==version` and its dependencies from the package index (pip
    --target), built once into COMPAT_CACHE and reused; first on PYTHONPATH, it runs that version with this
    torch."""
    target = COMPAT_CACHE / version
    if (target / "transformers").is_dir():
        return target
    COMPAT_CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{version}-", dir=COMPAT_CACHE))
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    command += ["--no-warn-conflicts", "--target", str(staging), f"transformers=={version}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"pip could not build transformers {version}: {done.stderr[-2000:]}")
    try:
        staging.rename(target)  # atomic: a concurrent build that finished first wins
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target
