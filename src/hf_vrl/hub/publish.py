"""`publish(run_dir, repo_id)`: a run's model, its processors, its remote code and its model card, uploaded to
the Hugging Face Hub in one commit.

Everything is checked before the Hub hears of it (the repo id, the model folder, the card); then the repo's
card is looked up (an existing card is replaced only with `overwrite_card=True`), the upload is assembled in a
temporary folder (links to the run's files plus README.md) and sent with one `upload_folder`. The token comes
from huggingface_hub's usual sources (`HF_TOKEN`, `hf auth login`) and is never printed or written.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.hub.card import model_card
from hf_vrl.hub.folder import ModelFolder

__all__ = ["Publication", "publish"]

CARD = "README.md"


@dataclass
class Publication:
    """What `publish` sent (with `dry_run`: would send): {path in repo: size in bytes}, the card, the files
    left behind, and the commit (None for a dry run)."""

    repo_id: str
    files: dict[str, int]
    card: Any
    left_out: list[str]
    commit: Any = None

    @property
    def url(self) -> str:
        return getattr(self.commit, "commit_url", None) or f"https://huggingface.co/{self.repo_id}"


def publish(
    run_dir: str | Path,
    repo_id: str,
    *,
    api: Any = None,
    what: str = "final",
    private: bool = False,
    overwrite_card: bool = False,
    license: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    commit_message: str | None = None,
    dry_run: bool = False,
) -> Publication:
    """Upload the model `what` ("final" or an export name, e.g. "vision-tower") of the run in `run_dir` to
    `repo_id` ("owner/name") with its model card, in one commit; returns what was sent.

    `api`: a `huggingface_hub.HfApi` (default: one with the token of the environment); `private`: create the
    repo private; `overwrite_card`: replace the repo's README.md if it has one; `license`, `base_model`,
    `datasets`: card metadata instead of what the run implies; `dry_run`: assemble and check, no Hub call.
    """
    _check_repo_id(repo_id)
    folder = ModelFolder.open(run_dir, what)
    card = model_card(folder, repo_id, license=license, base_model=base_model, datasets=datasets)
    sources = folder.files()
    sizes = {name: path.stat().st_size for name, path in sources.items()}
    sizes[CARD] = len(str(card).encode())
    publication = Publication(repo_id, dict(sorted(sizes.items())), card, folder.left_out())
    if dry_run:
        return publication
    api = api if api is not None else _default_api()
    if not overwrite_card and api.file_exists(repo_id, CARD, repo_type="model"):
        raise UserError(
            f"{repo_id} already has a model card (README.md): pass --overwrite-card to replace it"
        )
    with tempfile.TemporaryDirectory(prefix="hf-vrl-push-") as staging:
        _stage(Path(staging), sources, card)
        repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        publication.commit = api.upload_folder(
            repo_id=repo.repo_id,
            folder_path=staging,
            repo_type="model",
            commit_message=commit_message or f"Upload {folder.method} model ({what}) with hf_vrl",
        )
    return publication


def _check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UserError(f"{repo_id!r} is not a valid Hub repo id: {error}") from None
    if "/" not in repo_id:
        raise UserError(f"give the full repo id, owner/name (e.g. your-name/{repo_id}), not {repo_id!r}")


def _default_api() -> Any:
    """An `HfApi` with the environment's token; refuses early when there is none."""
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise UserError("not logged in to the Hugging Face Hub: run `hf auth login` or set HF_TOKEN")
    return HfApi()


def _stage(staging: Path, sources: dict[str, Path], card: Any) -> None:
    """Links to the files to upload (the weights are not copied) and the card, laid out as in the repo."""
    for name, source in sources.items():
        target = staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source.resolve())
    card.save(staging / CARD)
