"""Local Hub-cache copies of public dataset repos, in their published file structure (their dataset cards and
file listings), written under a tmp HF_HUB_CACHE: `datasets--<org>--<name>/{refs/<ref>, snapshots/<sha>/...}`,
read offline through the real huggingface_hub / datasets code.

- `pixparse/cc3m-wds`: `cc3m-train-NNNN.tar`, `cc3m-validation-NNNN.tar` in the repo root, members
  `<9-digit key>.jpg`, `.txt` (caption), `.json`; `_info.json` and `README.md` beside them.
- `timm/imagenet-1k-wds`: `imagenet1k-train-NNNN.tar`, `imagenet1k-validation-NNNN.tar`, members `.jpg`,
  `.cls` (class index), `.json`.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import datasets
import pytest
from huggingface_hub import constants
from PIL import Image

SHA = "46f3d69f840e59d77d52e8decfe5baec97e94c7f"  # pixparse/cc3m-wds's main at the time of writing


def jpeg(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (seed * 37 % 256, seed * 91 % 256, 120)).save(buffer, format="JPEG")
    return buffer.getvalue()


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A tar archive of (name, data) members, in order (webdataset groups a sample's members together)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def cc3m_shard(first_key: int, n: int, *, bad_caption_at: int | None = None) -> bytes:
    """One pixparse/cc3m-wds shard of `n` samples keyed from `first_key` (9 digits); the sample at
    `bad_caption_at` (an index in the shard) has a caption that is not UTF-8."""
    members = []
    for i in range(n):
        key = f"{first_key + i:09d}"
        caption = b"\xff\xfe not utf-8" if i == bad_caption_at else f"a photo number {first_key + i}".encode()
        meta = {"url": f"https://example.com/{key}.jpg", "key": key, "status": "success", "width": 48}
        members += [(f"{key}.jpg", jpeg(first_key + i)), (f"{key}.txt", caption)]
        members.append((f"{key}.json", json.dumps(meta).encode()))
    return tar_bytes(members)


def imagenet_wds_shard(first_key: int, n: int, classes: int = 10) -> bytes:
    """One timm/imagenet-1k-wds shard: `.jpg`, `.cls` (an index) and `.json` members, no caption."""
    members = []
    for i in range(n):
        key = f"n0144076_{first_key + i}"
        label = (first_key + i) % classes
        members += [(f"{key}.jpg", jpeg(first_key + i)), (f"{key}.cls", str(label).encode())]
        members.append((f"{key}.json", json.dumps({"label": label, "filename": f"{key}.JPEG"}).encode()))
    return tar_bytes(members)


def hub_cache_repo(
    cache: Path, repo_id: str, files: dict[str, bytes], *, ref: str = "main", sha: str = SHA
) -> Path:
    """Write `files` as the snapshot `sha` of dataset `repo_id` in the Hub cache `cache`, `ref` pointing at it
    (blobs under blobs/, the snapshot's files symlinked to them, as huggingface_hub writes them)."""
    repo = cache / f"datasets--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(sha)
    snapshot = repo / "snapshots" / sha
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        target = snapshot / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(blob)
    return snapshot


def cc3m_wds_files(train: list[int], validation: list[int], *, bad_caption: bool = False) -> dict[str, bytes]:
    """pixparse/cc3m-wds's files with shards of the given sizes; with `bad_caption`, the second sample of the
    first train shard has a caption that is not UTF-8."""
    files: dict[str, bytes] = {"README.md": b"---\nlicense: other\n---\n# CC3M\n", "_info.json": b"{}"}
    key = 0
    for split, sizes in (("train", train), ("validation", validation)):
        for index, n in enumerate(sizes):
            bad = 1 if bad_caption and split == "train" and index == 0 else None
            files[f"cc3m-{split}-{index:04d}.tar"] = cc3m_shard(key, n, bad_caption_at=bad)
            key += n
    return files


def imagenet_wds_files(train: list[int], validation: list[int]) -> dict[str, bytes]:
    files: dict[str, bytes] = {"README.md": b"# ImageNet-1k wds\n", "_info.json": b"{}"}
    key = 0
    for split, sizes in (("train", train), ("validation", validation)):
        for index, n in enumerate(sizes):
            files[f"imagenet1k-{split}-{index:04d}.tar"] = imagenet_wds_shard(key, n)
            key += n
    return files


def offline_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache for one test, offline (as HF_HUB_OFFLINE=1 sets it; subprocesses get both
    through the environment)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def write_files(folder: Path, files: dict[str, bytes]) -> Path:
    """`files` written under `folder` (a local copy in the repo's layout)."""
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def cub_copy_files(train_labels: list[int], test_labels: list[int]) -> dict[str, bytes]:
    """efekankavalci/CUB_200_2011's files: data/{train,test}-00000-of-00001.parquet (an image and a ClassLabel
    of the publisher's 200 class folders, `NNN.Name`) and a README."""
    names = [f"{i:03d}.Bird_{i}" for i in range(1, 201)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    files = {"README.md": b"# CUB-200-2011\n"}
    for split, labels in (("train", train_labels), ("test", test_labels)):
        rows = {"image": [Image.new("RGB", (12, 10), (i * 40, 20, 20)) for i in range(len(labels))]}
        buffer = io.BytesIO()
        datasets.Dataset.from_dict(rows | {"label": labels}, features=features).to_parquet(buffer)
        files[f"data/{split}-00000-of-00001.parquet"] = buffer.getvalue()
    return files
