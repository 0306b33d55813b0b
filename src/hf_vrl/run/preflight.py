"""What can be known before training is checked before a run writes anything: data names and paths, model
sources (local folders, presets, and Hub ids when the Hub is offline). Each failure is one `UserError` line
that names the setting to change."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError

logger = logging.getLogger("hf_vrl.run")
_WARNED: set[str] = set()  # folders whose auto_map the log has named (once each)

__all__ = [
    "check_data",
    "check_finished_run",
    "check_loggers",
    "check_model_kind",
    "check_push",
    "check_remote_code",
    "check_source",
    "check_tasks",
    "check_trained_model",
]


def check_data(name: str | None, what: str) -> None:
    """`name` (a registry name, prefix:target or path) names data that exists (nothing is read)."""
    if name is None:
        return
    from hf_vrl.data.registry import check_dataset_name

    check_dataset_name(name, what)


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or os.sep in value.strip("/").replace("/", "", 1)


def _cached(repo_id: str) -> bool:
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return folder.is_dir() and any(folder.iterdir())


def check_source(value: str | None, what: str, special: Iterable[str] = ()) -> None:
    """`value` names a model that can be loaded: an existing path, a preset in hub_configs/, a value in
    `special`, or a Hub id (checked against the local cache when the Hub is offline)."""
    if value is None or value in set(special):
        return
    from hf_vrl.presets import preset_path

    try:
        preset_path(value)
        return
    except FileNotFoundError:
        pass
    if _looks_like_path(value) or Path(os.path.expanduser(value)).suffix in (".json", ".safetensors"):
        raise UserError(
            f"{what} {value}: neither a local folder nor reachable on the Hugging Face Hub (no such path): "
            "check the path, or give a preset or a Hub id"
        )
    from huggingface_hub import constants
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        raise UserError(f"{what} {value!r}: not a local folder, a preset or a valid Hub id") from None
    if constants.HF_HUB_OFFLINE and not _cached(value):
        raise UserError(
            f"{what} {value}: neither a local folder nor reachable on the Hugging Face Hub (HF_HUB_OFFLINE=1 "
            "and it is not in the local cache): download it first, or give a local folder"
        )


def check_model_kind(value: str | None, what: str, accepts: Callable[[Any], bool], expected: str) -> None:
    """`value` (a folder, preset or Hub id that `check_source` accepted) names a model of the kind the method
    builds on: its configuration is read (no weights) and `accepts(config)` decides; one line otherwise."""
    if value is None:
        return
    from transformers import AutoConfig

    import hf_vrl.models  # noqa: F401  (registers hf_vrl's model types)
    from hf_vrl.eval_inputs import resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(value))
    except (OSError, ValueError):
        return  # no configuration to judge here: loading says what is wrong
    if not accepts(config):
        raise UserError(f"{what} {value} is a {config.model_type!r} model: {expected}")


def check_remote_code(path: str | None, what: str, trusted: bool) -> None:
    """A local model folder whose config names its own Python code (`auto_map`, a model type neither
    transformers nor hf_vrl registers) is loaded only with --trust-remote-code; refused before anything
    runs or is written otherwise (transformers itself refuses such code when the flag is off). Without the
    flag, the auto_map of a model type transformers or hf_vrl knows is not followed (the known class loads,
    as transformers does): the log says so, and what hf_vrl writes never carries it
    (`hf_vrl.run.trust.drop_foreign_auto_maps`)."""
    if path is None or trusted or not (Path(path) / "config.json").is_file():
        return
    import json

    from transformers import CONFIG_MAPPING

    from hf_vrl.models.auto import AUTO_CONFIGS  # importing it registers hf_vrl's model types

    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return  # not a model folder hf_vrl can judge: loading says what is wrong
    if not isinstance(config, dict) or not config.get("auto_map"):
        return
    if config.get("model_type") not in CONFIG_MAPPING:
        raise UserError(
            f"{what} {path} carries its own Python code (auto_map in config.json): add --trust-remote-code "
            "to run it, or give a model transformers or hf_vrl knows"
        )
    if config.get("model_type") in {known.model_type for known in AUTO_CONFIGS} or path in _WARNED:
        return  # hf_vrl's own model, its code the classes hf_vrl registers; or said already
    _WARNED.add(path)
    logger.warning(
        "%s %s names its own Python code (auto_map), which is not run: it loads as transformers' %r model "
        "(--trust-remote-code runs that code instead)",
        what,
        path,
        config.get("model_type"),
    )


def check_finished_run(path: str | os.PathLike, what: str) -> None:
    """`path` (a run folder or its final/) is not a run that stopped before final/: that one is finished
    first, by its own command with --resume auto."""
    from hf_vrl.run.layout import RunDir

    path = Path(path)
    run = RunDir(path.parent if path.name == "final" else path)
    if "method" in (run.recorded_config() or {}) and not run.final.is_dir():
        raise UserError(
            f"{what} {path}: the run in {run.root} stopped before final/ (killed or failed): finish it with "
            "the command that started it and --resume auto, then use its final/"
        )


def check_trained_model(path: str | os.PathLike, what: str) -> None:
    """`path` is not a training checkpoint (its weights and optimiser, no processors: made for resuming)."""
    from hf_vrl.run.layout import CHECKPOINT_COMPLETE_FILE

    path = Path(path)
    if path.name.startswith("checkpoint-") and (path / CHECKPOINT_COMPLETE_FILE).is_file():
        raise UserError(
            f"{what} {path} is a training checkpoint (made for resuming, without processors): give the run "
            "folder, whose final/ is the model (--resume auto finishes a stopped run)"
        )


def check_tasks(tasks: Iterable[str] | None, known: Iterable[str], method: str) -> None:
    """--tasks names only tasks the method's evaluation runs (a method without a choice takes none)."""
    known = list(known)
    if not tasks:
        return
    if not known:
        raise UserError(f"--tasks: {method} evaluates a fixed set of tasks; drop --tasks")
    unknown = [task for task in tasks if task not in known]
    if unknown:
        raise UserError(f"--tasks {unknown[0]}: unknown task; choose from {', '.join(known)}")


def check_loggers(report_to: Iterable[str]) -> None:
    """Every logger `report_to` names is installed (transformers would fail at the first step otherwise)."""
    from transformers.integrations import get_available_reporting_integrations

    available = set(get_available_reporting_integrations())
    missing = [name for name in report_to if name not in ("all", "none") and name not in available]
    if missing:
        raise UserError(
            f"--report-to {missing[0]}: it is not installed here (pip install {missing[0]}), or leave it out"
        )


def check_push(push_to_hub: bool, repo_id: str | None) -> None:
    """--push-to-hub can succeed when the run ends: a full repo id, the Hub online, a token that can write
    to the repo (`hf_vrl.hub.publish.check_write_access`)."""
    if not push_to_hub:
        return
    from huggingface_hub import constants, get_token

    from hf_vrl.hub.publish import check_repo_id, check_write_access

    try:
        check_repo_id(repo_id or "")
    except UserError as error:
        raise UserError(f"--hub-model-id: {error}") from None
    if constants.HF_HUB_OFFLINE:
        raise UserError("--push-to-hub needs the Hub, but HF_HUB_OFFLINE=1 is set: unset it, or push later")
    if get_token() is None:
        raise UserError("--push-to-hub: not logged in to the Hugging Face Hub (hf auth login, or HF_TOKEN)")
    try:
        check_write_access(repo_id)
    except UserError as error:
        raise UserError(f"--push-to-hub: {error}") from None
