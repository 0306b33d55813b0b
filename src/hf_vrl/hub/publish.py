"""`publish(run_dir, repo_id)`: a run's model (or a model folder hf_vrl saved, e.g. by `hf-vrl convert`), its
processors, its remote code and its model card, uploaded to the Hugging Face Hub in one commit.

The repo holds, at its root, the model (`final/`, or the export named by `what`) with its processors and
remote code, `README.md` (the card), `figures/`, `run/config.json` and `run/report.json` (the run's record,
local paths shortened) and, for each name in `exports`, `exports/<name>/`. Everything is checked and staged
before the Hub hears of it; the staging folder links to the run's files (the weights are not copied) and goes
up with one `upload_folder`. A model folder outside a run goes up alone, its card built from what it
records (`conversion.json`: the source checkpoint and the conversion's closeness). A dry run writes the
staging folder where it can be inspected and loaded. The token comes from `token`, else huggingface_hub's
usual sources (`HF_TOKEN`, `hf auth login`); it is never printed or written.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.hub.card import model_card
from hf_vrl.hub.data_names import is_hub_id, without_paths
from hf_vrl.hub.folder import CONVERSION_RECORD, ModelFolder, inside
from hf_vrl.hub.remote_code import write_remote_code
from hf_vrl.run.layout import OutputDir, RunLock, marker_command
from hf_vrl.run.trust import drop_foreign_auto_maps

__all__ = [
    "CARD",
    "RUN_RECORD",
    "Publication",
    "check_repo_id",
    "check_write_access",
    "portable_files",
    "portable_json",
    "publish",
]

CARD = "README.md"
RUN_RECORD = "run"  # run/config.json, run/report.json in the repo
STAGING = "hub-staging"  # a dry run's default staging folder, inside the run folder


@dataclass
class Publication:
    """What `publish` sent (with `dry_run`: would send): {path in repo: size in bytes}, the card, the files
    left behind, the staging folder of a dry run, and the commit (None for a dry run)."""

    repo_id: str
    card: Any
    files: dict[str, int] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    staging_dir: Path | None = None
    commit: Any = None

    @property
    def url(self) -> str:
        return getattr(self.commit, "commit_url", None) or f"https://huggingface.co/{self.repo_id}"


def publish(
    run_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    api: Any = None,
    revision: str | None = None,
    commit_message: str | None = None,
    what: str = "final",
    exports: Sequence[str] = (),
    license: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    dry_run: bool = False,
    staging_dir: str | Path | None = None,
    overwrite_card: bool = False,
) -> Publication:
    """Upload the model `what` ("final" or an export name) of the run in `run_dir` to `repo_id`
    ("owner/name") with its model card, the run's record and the `exports`, in one commit.

    `api`: a `huggingface_hub.HfApi` (default: `HfApi(token=token)`); `private`: create the repo private;
    `revision`: the branch to commit to (created if missing); `license`, `base_model`, `datasets`: card
    metadata instead of what the run implies; `dry_run`: stage into `staging_dir` (default
    `<run>/hub-staging/<owner>--<name>`) and return, no Hub call; `overwrite_card`: replace a README.md the
    repo already has (refused otherwise, before anything is uploaded).
    """
    check_repo_id(repo_id)
    if staging_dir is not None and not dry_run:
        raise UserError("a staging folder is for dry runs: add --dry-run, or leave out --staging-dir")
    folder = ModelFolder.open(run_dir, what)
    extra = {name: ModelFolder.open(run_dir, name) for name in dict.fromkeys(exports) if name != what}
    card = model_card(
        folder, repo_id, exports=list(extra), license=license, base_model=base_model, datasets=datasets
    )
    publication = Publication(repo_id, card)
    if dry_run:
        target = _dry_run_dir(staging_dir, folder, repo_id)
        with _held(folder), target.claim(), target.staged(replace=True) as staging:
            _stage(staging, folder, extra, publication)
        publication.staging_dir = target.root
        return publication
    api = api if api is not None else _default_api(token)
    with _held(folder), tempfile.TemporaryDirectory(prefix="hf-vrl-push-") as staging:
        _stage(Path(staging), folder, extra, publication)
        repo = api.create_repo(repo_id, token=token, private=private, exist_ok=True, repo_type="model")
        if revision:
            api.create_branch(repo.repo_id, branch=revision, token=token, repo_type="model", exist_ok=True)
        _check_card(api, repo.repo_id, revision, token, overwrite_card)
        publication.commit = api.upload_folder(
            repo_id=repo.repo_id,
            folder_path=staging,
            repo_type="model",
            revision=revision,
            token=token,
            commit_message=commit_message or f"Upload {folder.method} model ({folder.what}) with hf_vrl",
        )
    return publication


def _check_card(api: Any, repo_id: str, revision: str | None, token: str | None, overwrite: bool) -> None:
    """Refuse to replace the card a repository already has unless asked to."""
    exists = api.file_exists(repo_id, "README.md", repo_type="model", revision=revision, token=token)
    if exists and not overwrite:
        raise UserError(
            f"{repo_id} already has a model card (README.md); pass --overwrite-card (overwrite_card=True) "
            "to replace it with this run's"
        )


def check_repo_id(repo_id: str) -> None:
    """A full Hub model repo id (owner/name that `validate_repo_id` accepts), else a one-line UserError."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UserError(f"{repo_id!r} is not a valid Hub repo id: {error}") from None
    if "/" not in repo_id:
        raise UserError(f"give the full repo id, owner/name (e.g. your-name/{repo_id}), not {repo_id!r}")


ORG_ROLES_THAT_CREATE = frozenset(
    {"admin", "write", "contributor"}
)  # Hub organisation roles that create repos


def check_write_access(repo_id: str, api: Any = None) -> None:
    """That the token of `api` (default: the environment's) can write to `repo_id`, before anything is
    trained or staged: the Hub's write check of the repo where it exists, else the token's rights on the
    namespace the repo would be created in (`whoami`: a write token of the user, or of an organisation where
    the user may create repos; a fine-grained token with `repo.write` on it). A one-line UserError
    otherwise."""
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    api = api or _default_api(None)
    try:
        identity = api.whoami()
    except HfHubHTTPError as error:
        status = getattr(error.response, "status_code", "no answer")
        raise UserError(
            f"the Hub refused the token ({status}): log in again (hf auth login) or set a valid HF_TOKEN"
        ) from None
    user = identity.get("name", "this token")
    try:
        api.auth_check(repo_id, write=True)
        return
    except RepositoryNotFoundError:
        pass  # not there (or not visible to the token): it is created in its namespace
    except HfHubHTTPError:
        raise UserError(
            f"{user}'s token cannot write to {repo_id}: use a token with write access to it (hf auth login)"
        ) from None
    namespace = repo_id.split("/")[0]
    if not _can_create_in(identity, namespace):
        raise UserError(
            f"{user}'s token cannot create {repo_id} in {namespace!r}: a write token of {namespace!r} (or a "
            "fine-grained one with repo.write there) is needed, or give a repo id in your own namespace"
        )


def _can_create_in(identity: dict[str, Any], namespace: str) -> bool:
    """Whether the `whoami` answer allows creating a repo in `namespace`."""
    orgs = {org.get("name"): org.get("roleInOrg") for org in identity.get("orgs") or []}
    if namespace != identity.get("name") and orgs.get(namespace) not in ORG_ROLES_THAT_CREATE:
        return False
    token = (identity.get("auth") or {}).get("accessToken") or {}
    if token.get("role") == "fineGrained":
        scoped = (token.get("fineGrained") or {}).get("scoped") or []
        return any(
            (grant.get("entity") or {}).get("name") == namespace
            and "repo.write" in grant.get("permissions", [])
            for grant in scoped
        )
    return token.get("role") == "write"


def _default_api(token: str | None) -> Any:
    """An `HfApi` with `token`, else the environment's; refuses early when there is none."""
    from huggingface_hub import HfApi, get_token

    if token is None and get_token() is None:
        raise UserError(
            "not logged in to the Hugging Face Hub: run `hf auth login`, set HF_TOKEN or pass a token"
        )
    return HfApi(token=token)


def _dry_run_dir(staging_dir: str | Path | None, folder: ModelFolder, repo_id: str) -> OutputDir:
    """The staging folder of a dry run (`OutputDir` of `push`): by default
    `<run>/hub-staging/<owner>--<name>`, replaced by each dry run; a given one new, empty or an earlier dry
    run's. A default staging folder reached through a link (a linked `hub-staging/`) is refused: replacing it
    would delete outside the run."""
    if staging_dir is not None:
        target = OutputDir(Path(staging_dir), "push", "--staging-dir")
    else:
        target = OutputDir(folder.root / STAGING / repo_id.replace("/", "--"), "push", "--staging-dir")
        linked = next((p for p in (target.root.parent, target.root) if p.is_symlink()), None)
        if linked is not None:
            raise UserError(
                f"{linked} is a link: hf-vrl push stages inside the run only; remove the link, or give "
                "--staging-dir"
            )
    target.check()
    return target


@contextlib.contextmanager
def _held(folder: ModelFolder) -> Iterator[None]:
    """The folder's writer lock while it is staged (a run still training, or a command writing the folder,
    is refused in one line); a folder no hf_vrl command marked is read as it is."""
    if marker_command(folder.root) is None or RunLock.held_here(folder.root):  # --push-to-hub: the run's
        yield
        return
    with RunLock(folder.root, "folder"):
        yield


def _stage(
    staging: Path, folder: ModelFolder, exports: dict[str, ModelFolder], publication: Publication
) -> None:
    """Lay out the repo in `staging` and record its files and what stayed behind in `publication`."""
    _stage_model(staging, folder)
    publication.left_out += folder.left_out()
    for name, export in exports.items():
        _stage_model(staging / "exports" / name, export)
        publication.left_out += [f"exports/{name}/{file}" for file in export.left_out()]
        _code_at_root(staging, staging / "exports" / name)
    if folder.run is not None:
        _stage_run_record(staging, folder)
    publication.card.save(staging / CARD)
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    publication.files = {p.relative_to(staging).as_posix(): p.stat().st_size for p in files}


def _stage_run_record(staging: Path, folder: ModelFolder) -> None:
    """The run's figures, and its config.json and report.json without local paths (run/)."""
    if folder.run.figures.is_dir():
        figures = sorted(
            p for p in folder.run.figures.glob("*.png") if p.is_file() and inside(p, folder.root)
        )
        _link({f"figures/{p.name}": p for p in figures}, staging)
    record = staging / RUN_RECORD
    record.mkdir()
    for source in (folder.run.config_file, folder.run.report_file):
        _write_json(record / source.name, without_paths(json.loads(source.read_text())))


def _write_json(file: Path, data: Any) -> None:
    file.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _stage_model(target: Path, folder: ModelFolder) -> None:
    """The model's files as links; an hf_vrl model saved without its code gets it (and a new config.json)."""
    files = folder.files()
    if folder.needs_code:  # written fresh below, never through a link into the run
        files = {
            name: path for name, path in files.items() if name != "config.json" and not name.endswith(".py")
        }
    _link(files, target)
    if folder.needs_code:
        write_remote_code(folder.path, target)
    drop_foreign_auto_maps(target)  # an auto_map naming code elsewhere (another repo): not published
    portable_files(target)
    record = target / CONVERSION_RECORD
    if record.is_file():  # the converted checkpoint's local path is the user's business
        data = json.loads(record.read_text())
        record.unlink()
        _write_json(record, without_paths(data))


# files whose saved values can describe the machine that saved them; keys (at any depth) left out of them
MACHINE_STATE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json")
MACHINE_STATE_KEYS = frozenset({"local_files_only", "is_local", "cache_dir", "token", "use_auth_token"})
# transformers 5's generic tokenizer class, which 4.x does not know, by the name both resolve to it
PORTABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def portable_files(folder: Path) -> None:
    """The saved JSON files of a model folder (`MACHINE_STATE_FILES`) as every supported transformers loads
    them, each rewritten by `portable_json` where needed."""
    for name in MACHINE_STATE_FILES:
        portable_json(Path(folder) / name)


def portable_json(file: Path) -> None:
    """Replace `file` (a file, or a staged link into the run: the run is left alone) by a copy without what
    only meant something on the machine and the transformers that saved it: loading options
    (`local_files_only`, `is_local`, `cache_dir`, tokens), `_name_or_path` values that are local paths (a
    sub-config's source, e.g. CLUE's `runs/.../backbone`), and a tokenizer class only transformers 5 knows
    (`PORTABLE_TOKENIZER_CLASSES`)."""
    if not file.is_file():
        return
    data = json.loads(file.read_text())
    cleaned = _clean(data)
    if cleaned != data:
        file.unlink()
        file.write_text(json.dumps(cleaned, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _clean(value: Any) -> Any:
    if isinstance(value, list):
        return [_clean(item) for item in value]
    if not isinstance(value, dict):
        return value
    cleaned = {}
    for key, item in value.items():
        if key in MACHINE_STATE_KEYS:
            continue
        if key == "_name_or_path" and isinstance(item, str) and item and not _hub_id(item):
            item = ""
        if key == "tokenizer_class" and item in PORTABLE_TOKENIZER_CLASSES:
            item = PORTABLE_TOKENIZER_CLASSES[item]
        cleaned[key] = _clean(item)
    return cleaned


def _hub_id(name: str) -> bool:
    return is_hub_id(name) and not Path(name).exists()


def _code_at_root(staging: Path, export: Path) -> None:
    """A copy of an export's remote code at the repo root: transformers reads the code files an `auto_map`
    names from the root whatever `subfolder` says, so `AutoModel.from_pretrained(repo,
    subfolder="exports/<name>", trust_remote_code=True)` needs them there. A root file of the same name with
    other contents is refused."""
    for code in sorted(export.glob("*.py")):
        root = staging / code.name
        if not root.exists():
            shutil.copyfile(code, root)
        elif root.read_bytes() != code.read_bytes():
            raise UserError(
                f"exports/{export.name}/{code.name} differs from the model's {code.name}; transformers "
                "loads an export's remote code from the repo root, so publish that export in a repository "
                "of its own"
            )


def _link(files: dict[str, Path], target: Path) -> None:
    for name, source in files.items():
        link = target / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source.resolve())
