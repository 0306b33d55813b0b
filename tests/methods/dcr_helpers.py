"""Shared pieces of the DCR tests: a tiny stage-1 model with fixed weights and the toy data it trains on."""

from __future__ import annotations

import torch

from hf_vrl.data.toy import shapes_dataset
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel


def fixed_model() -> DCRModel:
    """The same weights every call (stage 2 resumes on top of a fixed stage-1 model, projector included)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return DCRModel.from_clip(tiny_clip(seed=0), condition_dim=16, num_condition_tokens=8)


def toy_data():
    """Twelve 16-px shapes-world images with the per-sample crop seed the run layer gives every row
    (`sample_seed`: `DCRCollator` crops from it, so resumed runs see the same crops whatever the prefetch)."""
    data = shapes_dataset(12, seed=0, image_size=16)
    return data.add_column("sample_seed", [1000 + i for i in range(len(data))])
