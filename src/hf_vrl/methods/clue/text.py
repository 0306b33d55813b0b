"""The text anchors of CLUE §4.3: every image's description, encoded once by a frozen CLIP text encoder.

A description comes from a dataset column (`text_source="caption"`, `"description"`, ...) or from a JSON file
`{image id: description}` written by `hf_vrl.methods.clue.describe` (`text_source="descriptions.json"`, looked
up by the row's `id_column`). `build_text_bank` embeds each distinct description once (`get_text_features` of
any CLIP-like model, L2-normalised) and caches the result as safetensors, keyed by the encoder and the texts;
the collator then looks the embeddings up per row, so training never runs the text encoder.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from hf_vrl.errors import UserError

logger = logging.getLogger(__name__)

__all__ = ["TextBank", "build_text_bank", "descriptions_of", "is_json_source", "load_descriptions"]


def is_json_source(text_source: str) -> bool:
    return text_source.endswith(".json")


def load_descriptions(path: str | Path) -> dict[str, str]:
    """`{image id: description}` from a JSON file (as `describe.py` writes it)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"no description file {path}: generate it with `python -m hf_vrl.methods.clue.describe` or set "
            "text_source to a dataset column"
        )
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise UserError(f"{path} must hold a JSON object {{image id: description}}")
    return data


@dataclass
class TextBank:
    """Unit-norm description embeddings `[N, D]` (float32, CPU) and how a row finds its description: the
    dataset column `column`, or `by_id[str(row[id_column])]`."""

    embeddings: torch.Tensor
    index: dict[str, int]
    column: str | None = None
    by_id: Mapping[str, str] | None = None
    id_column: str = "key"

    @property
    def dim(self) -> int:
        return self.embeddings.shape[1]

    def description(self, row: Mapping[str, Any]) -> str:
        if self.column is not None:
            if self.column not in row:
                raise UserError(f"the training rows have no {self.column!r} column to take descriptions from")
            return row[self.column]
        if self.id_column not in row:
            raise UserError(
                f"descriptions are keyed by image id, but the rows have no {self.id_column!r} column; set "
                "text_id_column to the dataset's id column"
            )
        key = str(row[self.id_column])
        if key not in self.by_id:
            raise UserError(f"the description file has no entry for image {key!r}; run describe.py again")
        return self.by_id[key]

    def embed_rows(self, rows: Sequence[Mapping[str, Any]]) -> torch.Tensor:
        """`[B, D]` embeddings of the rows' descriptions."""
        return self.embeddings[[self.index[self.description(row)] for row in rows]]


def descriptions_of(dataset: Any, text_source: str, id_column: str = "key") -> list[str]:
    """Every description the rows of `dataset` use (a map-style `datasets.Dataset`), in row order."""
    if is_json_source(text_source):
        by_id = load_descriptions(text_source)
        if id_column not in dataset.column_names:
            raise UserError(f"the dataset has no {id_column!r} column to look descriptions up by image id")
        missing = [key for key in map(str, dataset[id_column]) if key not in by_id]
        if missing:
            raise UserError(
                f"{len(missing)} images have no description in {text_source} (first: {missing[0]!r})"
            )
        return [by_id[str(key)] for key in dataset[id_column]]
    if text_source not in dataset.column_names:
        raise UserError(
            f"the dataset has no {text_source!r} column; set text_source to one of {dataset.column_names} "
            "or to a descriptions .json file"
        )
    return list(dataset[text_source])


def _cache_path(cache_dir: Path, encoder_name: str, texts: Sequence[str]) -> Path:
    digest = hashlib.sha256(json.dumps([encoder_name, list(texts)]).encode()).hexdigest()[:16]
    return cache_dir / f"text_bank-{digest}.safetensors"


def _encode(texts: Sequence[str], text_encoder: Any, tokenizer: Any, batch_size: int) -> torch.Tensor:
    from hf_vrl.evaluation import encode_texts

    was_training = text_encoder.training
    text_encoder.eval()
    try:
        return F.normalize(encode_texts(text_encoder, tokenizer, texts, batch_size=batch_size), dim=-1)
    finally:
        text_encoder.train(was_training)


def _load_encoder(name: str, device: str | torch.device | None) -> tuple[Any, Any]:
    """A CLIP-like model and its tokenizer by Hub id, folder or hub_configs name, on `device` (default: CUDA
    when available). A folder with a config but no weights (`tiny-clip`) gives a randomly initialised model
    with seed 0: a fixed random text tower, for toy runs only."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from hf_vrl.devices import default_device
    from hf_vrl.presets import HUB_CONFIGS

    path = HUB_CONFIGS / name if (HUB_CONFIGS / name).is_dir() else Path(name)
    if path.is_dir() and not any(path.glob("*.safetensors")):
        logger.warning(
            "%s holds no weights: the descriptions are embedded by a random text tower (seed 0)", path
        )
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = AutoModel.from_config(AutoConfig.from_pretrained(path))
    else:
        from hf_vrl.weights import load_pretrained

        model = load_pretrained(AutoModel, str(path) if path.is_dir() else name, extra_allowed=True)
    return model.to(device or default_device()), AutoTokenizer.from_pretrained(
        str(path) if path.is_dir() else name
    )


def build_text_bank(
    descriptions: Iterable[str],
    text_encoder: str | Any,
    *,
    tokenizer: Any = None,
    text_source: str = "caption",
    id_column: str = "key",
    cache_dir: str | Path | None = None,
    batch_size: int = 256,
    device: str | torch.device | None = None,
) -> TextBank:
    """Embed each distinct description once with a frozen CLIP-like text encoder (a Hub id, a local folder,
    `"tiny-clip"`, or a loaded model with `get_text_features` plus its `tokenizer`); with `cache_dir`, reuse
    or write `text_bank-<hash>.safetensors` there (the hash covers the encoder's name and the texts). An
    encoder loaded by name goes to `device` (default: CUDA when available); a loaded one stays where it is."""
    texts = sorted(set(descriptions))
    if not texts:
        raise UserError("no descriptions to encode: the text term needs at least one")
    name = text_encoder if isinstance(text_encoder, str) else getattr(text_encoder, "name_or_path", "model")
    cache = _cache_path(Path(cache_dir), str(name), texts) if cache_dir is not None else None
    if cache is not None and cache.is_file():
        embeddings = load_file(cache)["embeddings"]
    else:
        if isinstance(text_encoder, str):
            text_encoder, tokenizer = _load_encoder(text_encoder, device)
        if tokenizer is None:
            raise ValueError("a loaded text encoder needs its tokenizer")
        with torch.no_grad():
            embeddings = _encode(texts, text_encoder, tokenizer, batch_size).float().cpu().contiguous()
        if cache is not None:
            from hf_vrl.run.layout import readable_as_umask

            cache.parent.mkdir(parents=True, exist_ok=True)
            partial = cache.with_suffix(".partial")
            save_file({"embeddings": embeddings}, partial)
            readable_as_umask(partial)  # safetensors writes 0600; the cache follows the umask
            partial.replace(cache)
    column = None if is_json_source(text_source) else text_source
    by_id = load_descriptions(text_source) if column is None else None
    return TextBank(embeddings, {t: i for i, t in enumerate(texts)}, column, by_id, id_column)
