"""The model folder `hf-vrl push` publishes: a run's (`final/`, or `exports/<name>/`), or a model folder
hf_vrl saved outside a run (`hf-vrl convert`, `save_pretrained` of an hf_vrl model); the checks before
anything is uploaded, and the files that go up.

Uploaded: only what a model folder needs (`MODEL_FILES`: the weights as safetensors, configs, processor and
tokenizer files, `conversion.json`) and the remote-code modules a custom model's `auto_map` names; an export
without an image processor borrows the run's (`final/`). Anything else in the folder (pickles, optimizer
states, a `token.txt` or `credentials.json` someone left there, a link that leads out of the run) stays
behind, and weights that are not finite (NaN, inf) are refused. An hf_vrl model saved without its code
(no `auto_map`, or a module it names missing) gets it at staging (`hf_vrl.hub.remote_code`), so the Hub copy
loads with `trust_remote_code=True` where hf_vrl is not installed. How the model loads is `hf_vrl.hub.usage`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.hub.remote_code import code_complete, code_files, hf_vrl_model_type
from hf_vrl.run.layout import CHECKPOINT_MANIFEST, RunDir
from hf_vrl.run.trust import local_auto_map

__all__ = ["CONVERSION_RECORD", "IMAGE_PROCESSOR", "MODEL_FILES", "TOKENIZER_FILES", "ModelFolder"]

# the files of a model folder that go to the Hub (its remote code aside: the modules its auto_map names)
MODEL_FILES = frozenset(
    {
        "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
        "conversion.json", "preprocessor_config.json", "processor_config.json",
        "image_processor_config.json", "video_preprocessor_config.json", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
        "vocab.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja",
        "chat_template.json",
    }
)  # fmt: skip
WEIGHT_SHARD = re.compile(r"^model-\d+-of-\d+\.safetensors$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
IMAGE_PROCESSOR = "preprocessor_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SHARD_INDEX = "model.safetensors.index.json"
CONVERSION_RECORD = "conversion.json"  # what `hf-vrl convert` converted, and how close the result came
# an hf_vrl model type -> the method whose card describes it (a model folder outside a run)
MODEL_TYPE_METHODS = {"diffclip": "diffclip", "dcr": "dcr", "clue": "clue"}


@dataclass(frozen=True)
class ModelFolder:
    """One publishable model of a run (module docstring); `open` checks it."""

    run: RunDir | None  # None: a model folder outside a run
    what: str
    path: Path
    config: dict[str, Any]  # the model's config.json
    run_config: dict[str, Any]  # the run's config.json

    @classmethod
    def open(cls, run_dir: str | Path, what: str = "final") -> ModelFolder:
        """The folder `what` ("final" or an export name) of the run in `run_dir`, or the model folder
        `run_dir` itself, checked for publishing."""
        run = RunDir(Path(run_dir))
        run_config = run.recorded_config() or {}
        if "method" not in run_config:
            return cls._model_folder(Path(run_dir), what)
        path = run.final if what == "final" else run.exports / what
        if not path.is_dir():
            raise UserError(
                f"{run.root} has no {what!r} model; it has: {', '.join(_available(run)) or 'none'}"
            )
        _check_weights(path)
        config = _read_config(path)
        if not hf_vrl_model_type(config):
            _check_remote_code(path, config)
        return cls(run=run, what=what, path=path, config=_own_code_only(path, config), run_config=run_config)

    @classmethod
    def _model_folder(cls, path: Path, what: str) -> ModelFolder:
        """A model folder hf_vrl saved outside a run: an hf_vrl model type, or a `hf-vrl convert` result."""
        if not (path / "config.json").is_file() or not _has_weights(path):
            raise UserError(
                f"{path} is neither a run folder written by `hf-vrl train` nor a model folder (config.json "
                "and *.safetensors)"
            )
        if any("method" in (RunDir(p).recorded_config() or {}) for p in (path.parent, path.parent.parent)):
            raise UserError(
                f"{path} is not a run folder written by `hf-vrl train` (it is a model folder: give the run "
                "folder around it)"
            )
        if what != "final":
            raise UserError(f"{path} is a model folder, not a run: it has no exports (leave out --what)")
        config = _read_config(path)
        if not hf_vrl_model_type(config) and not (path / CONVERSION_RECORD).is_file():
            raise UserError(
                f"{path} was not saved by hf_vrl (model type {config.get('model_type')!r}): publish it with "
                "huggingface_hub's upload_folder, or push the run folder it came from"
            )
        _check_weights(path)
        return cls(run=None, what="model", path=path, config=_own_code_only(path, config), run_config={})

    @property
    def method(self) -> str:
        if self.run is None:
            return str(self.conversion.get("method") or MODEL_TYPE_METHODS[self.config["model_type"]])
        return str(self.run_config.get("method"))

    @property
    def conversion(self) -> dict[str, Any]:
        """The `hf-vrl convert` record of the folder ({} where there is none)."""
        record = self.path / CONVERSION_RECORD
        return json.loads(record.read_text()) if record.is_file() else {}

    @property
    def remote_code(self) -> bool:
        return "AutoModel" in self.config.get("auto_map", {}) or self.needs_code

    @property
    def needs_code(self) -> bool:
        """An hf_vrl model whose folder lacks the remote code (or the auto_map) to load without hf_vrl."""
        return hf_vrl_model_type(self.config) and not code_complete(self.path, self.config)

    @property
    def dual_encoder(self) -> bool:
        return "text_config" in self.config and "vision_config" in self.config

    @property
    def pipeline_tag(self) -> str:
        return "zero-shot-image-classification" if self.dual_encoder else "image-feature-extraction"

    @property
    def root(self) -> Path:
        """The folder nothing uploaded may lead out of: the run's, or the model folder itself."""
        return self.run.root if self.run is not None else self.path

    def files(self) -> dict[str, Path]:
        """{file name: file on disk} of the model's files to upload (missing remote code comes at staging)."""
        files = {p.name: p for p in sorted(self.path.iterdir()) if self._uploaded(p)}
        borrowed = self.run.final / IMAGE_PROCESSOR if self.run is not None else self.path / IMAGE_PROCESSOR
        if IMAGE_PROCESSOR not in files and self._uploaded(borrowed):
            files[IMAGE_PROCESSOR] = borrowed
        return files

    def left_out(self) -> list[str]:
        """Files (and links) of the folder that are not uploaded, but for the run's own record of it
        (`CHECKPOINT_MANIFEST`: its files and the run that wrote it)."""
        return [
            p.name
            for p in sorted(self.path.iterdir())
            if (p.is_file() or p.is_symlink()) and not self._uploaded(p) and p.name != CHECKPOINT_MANIFEST
        ]

    def _uploaded(self, path: Path) -> bool:
        """A file the model needs (`MODEL_FILES`, a weight shard, a module of its own remote code) that is
        in the run, not reached through a link leading out of it."""
        code = code_files(self.path, self.config) if path.suffix == ".py" else set()
        needed = path.name in MODEL_FILES or WEIGHT_SHARD.match(path.name) or path.name in code
        return bool(needed) and path.is_file() and inside(path, self.root)


def _available(run: RunDir) -> list[str]:
    names = ["final"] if run.final.is_dir() else []
    if run.exports.is_dir():
        names += sorted(p.name for p in run.exports.iterdir() if p.is_dir() and not p.name.startswith("."))
    return names


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, links resolved, lies in `root`."""
    return path.resolve().is_relative_to(root.resolve())


def _own_code_only(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """`config` with only the auto_map entries whose code is in `path` (`hf_vrl.run.trust`): an entry
    naming code elsewhere is not published."""
    if "auto_map" not in config:
        return config
    kept = local_auto_map(path, config["auto_map"])
    return {**{k: v for k, v in config.items() if k != "auto_map"}, **({"auto_map": kept} if kept else {})}


def _has_weights(path: Path) -> bool:
    return any(path.glob("*.safetensors"))


def _check_weights(path: Path) -> None:
    if not _has_weights(path):
        if any(p.suffix in PICKLE_SUFFIXES for p in path.iterdir()):
            raise UserError(
                f"{path} holds pickled PyTorch weights only; hf_vrl publishes safetensors: re-save the model "
                "with save_pretrained (safe_serialization is the default)"
            )
        raise UserError(
            f"{path} has no weights (*.safetensors): the run did not finish, or this is not a model"
        )
    index = path / SHARD_INDEX
    if index.is_file():
        shards = set(json.loads(index.read_text())["weight_map"].values())
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise UserError(f"{path} lacks weight shards its index lists: {', '.join(missing)}")
    _check_finite(path)


def _check_finite(path: Path) -> None:
    """Refuse weights that are not all finite (a run whose loss diverged saved NaN or inf)."""
    import torch
    from safetensors import safe_open

    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():
                tensor = weights.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise UserError(
                        f"{file} holds non-finite weights ({name}: NaN or inf): the run diverged; train it "
                        "again (a lower learning rate) instead of publishing it"
                    )


def _read_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise UserError(f"{path} has no config.json: it is not a transformers model folder")
    return json.loads(file.read_text())


def _check_remote_code(path: Path, config: dict[str, Any]) -> None:
    """Every module the config's `auto_map` names must be in the folder (else the Hub copy cannot load)."""
    if not code_complete(path, config, require_auto_map=False):
        raise UserError(f"{path}: config.json's auto_map names modules that are not in the folder")
