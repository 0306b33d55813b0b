"""DiVE's data: FLYP captions for the target set, and the reference batches drawn beside each target batch.

Target rows are labelled images; FLYP turns each label into a caption through a template drawn per sample
(Goyal et al. 2023 write one row per image and template; a random template per draw is the same
distribution). The template is drawn from ``torch.Generator().manual_seed(row["sample_seed"])`` when the run
layer adds that column (so a resumed run draws the same captions), else from torch's global RNG.

The reference set (CC3M, COCO, Flickr, any image-caption dataset) is read by `ReferenceLoader`: an endless
stream of reference batches, whose position (batches drawn) is checkpointed, so a resumed run continues with
the very batch it would have drawn. A map-style set is drawn by global position: draw b of pass p is rows
b·G .. (b+1)·G of a permutation seeded by (seed, p), G the rows of a draw over all processes, and process r
takes its r-th slice, so the rows of every draw (and the run's result) do not depend on the process count.
Reference images are preprocessed deterministically (the model's image processor, no augmentation): the
frozen model's embedding of a reference sample is a fixed function of the sample, which is what makes the
embedding cache exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from hf_vrl.data.collate import ImageTextCollator
from hf_vrl.data.prompts import CAPTION_TEMPLATES, fill_template
from hf_vrl.data.schema import CAPTION, LABEL
from hf_vrl.errors import UserError

__all__ = [
    "REFERENCE_INDEX",
    "FLYPCollator",
    "ReferenceCollator",
    "ReferenceLoader",
    "class_captions",
    "load_reference_dataset",
    "select_classes",
]

REFERENCE_INDEX = "reference_index"  # a reference sample's row in the reference set (the cache key)
SAMPLE_SEED = "sample_seed"


def class_captions(
    labels: Sequence[int],
    class_names: Sequence[str],
    templates: Sequence[str],
    template_indices: Sequence[int],
) -> list[str]:
    """FLYP's captions: ``templates[k_i]`` filled with the class name of ``labels[i]`` (Eq. 2, DiVE)."""
    if len(labels) != len(template_indices):
        raise ValueError(f"{len(labels)} labels but {len(template_indices)} template indices")
    captions = []
    for label, k in zip(labels, template_indices):
        if not 0 <= int(label) < len(class_names):
            raise ValueError(f"label {label} has no class name (the dataset has {len(class_names)} classes)")
        captions.append(fill_template(templates[int(k) % len(templates)], class_names[int(label)]))
    return captions


def _template_index(row: dict[str, Any], n_templates: int) -> int:
    """A template index drawn from the row's own seed when it has one, else from torch's global RNG."""
    generator = None
    if row.get(SAMPLE_SEED) is not None:
        generator = torch.Generator().manual_seed(int(row[SAMPLE_SEED]))
    return int(torch.randint(n_templates, (), generator=generator))


@dataclass
class FLYPCollator:
    """Target rows (image, label[, sample_seed]) -> a contrastive batch whose captions are class prompts."""

    image_processor: Any
    tokenizer: Any
    class_names: Sequence[str]
    templates: Sequence[str] | None = None
    max_length: int = 77
    crop_scale: Sequence[float] | None = None

    def __post_init__(self) -> None:
        self.templates = list(self.templates or CAPTION_TEMPLATES)
        self._collate = ImageTextCollator(self.image_processor, self.tokenizer, max_length=self.max_length)

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("cannot collate an empty batch")
        labels = [row[LABEL] for row in rows]
        picks = [_template_index(row, len(self.templates)) for row in rows]
        captions = class_captions(labels, self.class_names, self.templates, picks)
        images = [row["image"] for row in rows]
        if self.crop_scale is not None:
            size = processor_size(self.image_processor)
            images = [flyp_crop(row["image"], size, self.crop_scale, _crop_generator(row)) for row in rows]
        return self._collate.preprocess({"image": images, CAPTION: captions, LABEL: labels})


def processor_size(image_processor: Any) -> int:
    """The square side an image processor outputs (its crop size, else its size)."""
    for name in ("crop_size", "size"):
        value = getattr(image_processor, name, None)
        if isinstance(value, int):
            return value
        for key in ("height", "shortest_edge"):  # a dict (transformers 4) or a SizeDict (5)
            side = value.get(key) if isinstance(value, dict) else getattr(value, key, None)
            if side:
                return int(side)
    raise ValueError(f"cannot read the output size of {type(image_processor).__name__}")


def flyp_crop(image: Any, size: int, scale: Sequence[float], generator: torch.Generator | None = None) -> Any:
    """FLYP's training crop (its vendored CLIP `_transform(is_train=True)`): RandomResizedCrop(size, scale,
    ratio 3/4-4/3) with bicubic resampling, on a PIL image."""
    from PIL import Image

    from hf_vrl.data.crop import random_resized_crop_box

    image = image if image.mode == "RGB" else image.convert("RGB")
    top, left, h, w = random_resized_crop_box(
        image.height, image.width, (float(scale[0]), float(scale[1])), (3 / 4, 4 / 3), generator
    )
    return image.resize((size, size), Image.BICUBIC, box=(left, top, left + w, top + h))


def _crop_generator(row: dict[str, Any]) -> torch.Generator | None:
    """The crop's generator: from the row's seed (a stream apart from the template draw's), else global."""
    seed = row.get(SAMPLE_SEED)
    return None if seed is None else torch.Generator().manual_seed((int(seed) * 2654435761 + 1) % 2**63)


@dataclass
class ReferenceCollator:
    """Reference rows -> a contrastive batch (their own captions), `reference_index` when rows have it."""

    collate: Callable[[Sequence[dict[str, Any]]], dict[str, torch.Tensor]]

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if REFERENCE_INDEX not in rows[0]:
            return self.collate(rows)
        batch = self.collate([{k: v for k, v in row.items() if k != REFERENCE_INDEX} for row in rows])
        batch[REFERENCE_INDEX] = torch.tensor([int(row[REFERENCE_INDEX]) for row in rows])
        return batch


class _Indexed(Dataset):
    """A map-style dataset whose rows carry their index (`REFERENCE_INDEX`)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**self.dataset[index], REFERENCE_INDEX: index}


class _GlobalDraws(Sampler):
    """Endless draws of `rows` x `world_size` row indices by global position (the module docstring), this
    process's slice of each: pass p is a permutation seeded by (seed, p), cut into whole draws; starts after
    `start` draws."""

    def __init__(self, size: int, rows: int, seed: int, start: int, rank: int, world_size: int) -> None:
        self.size, self.rows, self.seed, self.start = size, rows, seed, start
        self.draw = rows * world_size
        self.slice = slice(rank * rows, (rank + 1) * rows)
        self.per_pass = size // self.draw

    def __iter__(self) -> Iterator[list[int]]:
        epoch, first = divmod(self.start, self.per_pass)
        while True:
            order = torch.randperm(
                self.size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            )
            for b in range(first, self.per_pass):
                yield order[b * self.draw : (b + 1) * self.draw][self.slice].tolist()
            epoch, first = epoch + 1, 0


class ReferenceLoader:
    """Endless reference batches of `batch_size` pairs for process `rank` of `world_size`.

    Map-style sets are drawn by global position (the module docstring: a draw is `batch_size` x `world_size`
    rows, the same rows on any process count), reshuffled every pass with a seed of (seed, pass); batches
    carry `reference_index`, the sample's row in the set. Streams are split between processes
    (`datasets.distributed.split_dataset_by_node`, as the run's training streams: their rows depend on the
    process count) and restarted with `set_epoch(pass)` at their end. `drawn` counts the batches handed out;
    a loader built with `start=drawn` continues exactly there (a map-style set jumps to it; a stream reads
    and drops the batches before it).
    """

    def __init__(
        self,
        dataset: Any,
        collate: Callable[[Sequence[dict[str, Any]]], dict[str, torch.Tensor]],
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        start: int = 0,
    ) -> None:
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        self.collate = ReferenceCollator(collate)
        self.streaming = isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__")
        if not self.streaming and len(dataset) < batch_size * world_size:
            raise UserError(
                f"the reference set has {len(dataset)} samples, fewer than one draw of "
                f"{batch_size * world_size} reference pairs: use a larger set or a smaller "
                "reference_batch_size."
            )
        self.drawn = start
        self._batches = self._stream_batches() if self.streaming else self._map_batches()

    def _loader(self, dataset: Any, **kwargs: Any) -> DataLoader:
        return DataLoader(dataset, collate_fn=self.collate, num_workers=self.num_workers, **kwargs)

    def _map_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        draws = _GlobalDraws(
            len(self.dataset), self.batch_size, self.seed, self.drawn, self.rank, self.world_size
        )
        return iter(self._loader(_Indexed(self.dataset), batch_sampler=draws))

    def _stream_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        from datasets.distributed import split_dataset_by_node

        stream = self.dataset
        if self.world_size > 1:
            stream = split_dataset_by_node(stream, rank=self.rank, world_size=self.world_size)
        to_skip, epoch = self.drawn, 0
        while True:
            if hasattr(stream, "set_epoch"):
                stream.set_epoch(epoch)
            empty = True
            for batch in self._loader(stream, batch_size=self.batch_size, drop_last=True):
                empty = False
                if to_skip:
                    to_skip -= 1
                    continue
                yield batch
            if empty:
                raise UserError(
                    f"the reference stream holds fewer than {self.batch_size} samples for this process; "
                    "use a larger reference set or a smaller reference_batch_size."
                )
            epoch += 1

    def __iter__(self) -> ReferenceLoader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = next(self._batches)
        self.drawn += 1
        return batch


def load_reference_dataset(settings: Any, *, seed: int = 0, image_size: int | None = None) -> Any:
    """The reference set named by `settings.reference_dataset` (a `DiVESettings`), from the data registry;
    several names are concatenated (image and caption columns), each read up to `reference_limit`."""
    from datasets import concatenate_datasets

    from hf_vrl.data.registry import load_dataset_by_name

    names = settings.reference_dataset
    names = [names] if isinstance(names, str) else list(names)
    parts = [
        load_dataset_by_name(
            name,
            split=settings.reference_split,
            limit=settings.reference_limit,
            seed=seed,
            image_size=image_size,
        )
        for name in names
    ]
    if len(parts) == 1:
        return parts[0]
    return concatenate_datasets([part.select_columns(["image", CAPTION]) for part in parts])


def select_classes(dataset: Any, classes: Sequence[int]) -> Any:
    """The rows of a labelled map-style dataset whose label is in `classes`, relabelled 0..len(classes)-1 with
    a ClassLabel of those classes' names (a fine-tuning target, or a zero-shot set, over a class subset)."""
    from datasets import ClassLabel

    names = dataset.features[LABEL].names
    new_label = {int(old): new for new, old in enumerate(classes)}
    subset = dataset.filter(lambda label: label in new_label, input_columns=LABEL)
    features = subset.features.copy()
    features[LABEL] = ClassLabel(names=[names[int(c)] for c in classes])
    return subset.map(lambda label: {LABEL: new_label[label]}, input_columns=LABEL, features=features)
