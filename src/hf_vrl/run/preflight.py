"""What can be known before training is checked before a run writes anything: data names and paths, model
sources (local folders, presets, and Hub ids when the Hub is offline). Each failure is one `UserError` line
that names the setting to change."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hf_vrl.errors import UserError

__all__ = ["check_data", "check_loggers", "check_push", "check_source"]


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
