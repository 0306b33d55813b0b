"""Real tiny runs to publish (one of each method, trained by the project's own commands; DiffCLIP, DCR and
DiVE evaluated on Fashion-MNIST, which is on the Hub, CLUE on the shapes world, which is not)
and an autospec'd `HfApi` standing in for the Hub: it records every call and keeps what `upload_folder` was
given (the staging folder is gone after the call)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from unittest.mock import create_autospec

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import CommitInfo, HfApi, RepoUrl
from huggingface_hub.errors import RepositoryNotFoundError
from transformers import AutoTokenizer, CLIPImageProcessor

import hf_vrl
from hf_vrl.methods.dcr.diffusion import tiny_diffusion
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.presets import preset_path

# tests/models/remote_code.py (fresh processes per release), tests/integrations/llava_helpers.py (tiny LLaVA)
sys.path[:0] = [str(Path(__file__).parents[1] / folder) for folder in ("models", "integrations")]


@pytest.fixture(scope="session")
def diffclip_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("diffclip") / "run"
    hf_vrl.train(
        "diffclip", output_dir=str(out), max_steps=2, train_limit=32, batch_size=8, eval_limit=16,
        eval_dataset="fashion_mnist",  # on the Hub: the model-index records it
    )  # fmt: skip
    return out


@pytest.fixture(scope="session")
def dcr_run(tmp_path_factory) -> Path:
    """Both DCR stages from a 16-px CLIP and a tiny SD pipeline (tests/methods/test_dcr_method's settings)."""
    root = tmp_path_factory.mktemp("dcr")
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    tiny_clip(image_size=16, vocab_size=len(tokenizer)).save_pretrained(root / "clip")
    tokenizer.save_pretrained(root / "clip")
    processor = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor.save_pretrained(root / "clip")
    sd = tiny_diffusion(root / "sd", image_size=16, text_context_length=8)
    tiny = dict(
        clip=str(root / "clip"), clip_pretrain_steps=0, diffusion=str(sd), batch_size=3, train_limit=12,
        eval_limit=30, stage1_steps=2, max_steps=2, save_steps=1, logging_steps=1, lora_r=4,
        eval_dataset="fashion_mnist",  # on the Hub: the model-index records the clustering scores on it
    )  # fmt: skip
    hf_vrl.train("dcr", output_dir=str(root / "run"), **tiny)
    return root / "run"


@pytest.fixture(scope="session")
def dive_run(tmp_path_factory) -> Path:
    """dive-tiny shrunk: a tiny CLIP pre-trained for 3 steps, then 2 DiVE steps."""
    out = tmp_path_factory.mktemp("dive") / "run"
    tiny = dict(
        pretrain_steps=3, pretrain_data={"digits": 32, "shapes": 32}, pretrain_batch_size=16,
        train_limit=80, batch_size=8, max_steps=2, save_steps=2, eval_limit=40, reference_limit=16,
        val_size=0, rsa_limit=12, zero_shot_datasets=["shapes"], rsa_dataset="shapes",
        reference_dataset=["digits", "shapes"],
    )  # fmt: skip
    hf_vrl.train("dive", output_dir=str(out), **tiny)
    return out


@pytest.fixture(scope="session")
def clue_run(tmp_path_factory) -> Path:
    """clue-tiny shrunk: a ResNet pre-trained for 2 steps, then 2 CLUE steps."""
    out = tmp_path_factory.mktemp("clue") / "run"
    tiny = dict(
        train_limit=32, batch_size=8, max_steps=2, save_steps=2, eval_limit=24, backbone_pretrain_steps=2,
        part_map_images=2, text_encoder_pretrain_steps=2,
    )  # fmt: skip
    hf_vrl.train("clue", output_dir=str(out), **tiny)
    return out


class FakeHub:
    """What the autospec'd `api` was asked to do, and the repos it received (`repos[repo_id]` folder)."""

    def __init__(self, root: Path):
        self.root = root
        self.api = create_autospec(HfApi, instance=True)
        self.api.create_repo.side_effect = lambda repo_id, **_: RepoUrl(f"https://huggingface.co/{repo_id}")
        self.api.upload_folder.side_effect = self._upload
        self.api.file_exists.side_effect = lambda repo_id, filename, **_: (
            self.root / repo_id / filename
        ).is_file()
        # the token: a write token of user "me" (member of nothing); `auth_check` answers as the Hub does
        self.api.whoami.return_value = {"name": "me", "orgs": [], "auth": {"accessToken": {"role": "write"}}}
        self.api.auth_check.side_effect = self._auth_check

    def _auth_check(self, repo_id: str, **_) -> None:
        if not self.repo(repo_id).is_dir():
            raise RepositoryNotFoundError(
                "404", response=hub_response(404, f"api/models/{repo_id}/auth-check")
            )

    def _upload(self, *, repo_id: str, folder_path: str, **_) -> CommitInfo:
        shutil.copytree(folder_path, self.root / repo_id, dirs_exist_ok=True)  # links copied as files
        url = f"https://huggingface.co/{repo_id}/commit/0123abcd"
        return CommitInfo(commit_url=url, commit_message="", commit_description="", oid="0123abcd")

    def repo(self, repo_id: str) -> Path:
        return self.root / repo_id

    def files(self, repo_id: str) -> set[str]:
        root = self.repo(repo_id)
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    @property
    def calls(self) -> list[str]:
        return [name for name, _, _ in self.api.method_calls]


def hub_response(status: int, path: str) -> httpx2.Response:
    """The HTTP answer the Hub gives with `status` (for the errors huggingface_hub raises)."""
    return httpx2.Response(status, request=httpx2.Request("GET", f"https://huggingface.co/{path}"))


@pytest.fixture
def hub(tmp_path) -> FakeHub:
    return FakeHub(tmp_path / "hub")


@pytest.fixture
def hub_client(monkeypatch, hub):
    """`HfApi()` as `hf-vrl push` builds it: the autospec'd fake, the constructor's arguments recorded. The
    fake Hub is reachable: HF_HUB_OFFLINE (set for every test) is lifted, or push would refuse to upload."""
    made = []
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def factory(*args, **kwargs):
        made.append((args, kwargs))
        return hub.api

    monkeypatch.setattr(huggingface_hub, "HfApi", factory)
    return made
