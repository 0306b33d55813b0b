"""Live-tensor accounting and the automatic UNet chunk size, on hand-checkable cases."""

from __future__ import annotations

import pytest
import torch

from hf_vrl.errors import UserError
from hf_vrl.methods.dcr.memory import LiveMemory, choose_chunk_size, measure_pair_memory


def test_live_memory_counts_new_storages_once():
    outside = torch.ones(100)  # existed before: never counted, nor are its views
    with LiveMemory() as memory:
        a = torch.zeros(250)  # 1000 bytes
        view = a[:10].view(2, 5)
        outside_view = outside.view(10, 10)
        a.add_(1.0)  # in place: same storage
        assert memory.live == 1000
        b = a * 2  # 1000 more
        assert memory.live == 2000 and memory.peak == 2000
        del b
        assert memory.live == 1000 and memory.peak == 2000
        del a, view
        assert memory.live == 0
    assert outside_view.shape == (10, 10)


def test_measure_pair_memory_separates_kept_and_transient():
    """y = sin(c * w): backward needs sin's input c * w (64 floats = 256 bytes a pair), not the output."""
    weight = torch.randn(64)
    kept, transient = measure_pair_memory(lambda c: (c * weight).sin(), torch.randn(4, 64))
    assert kept == 64 * 4
    assert transient > 0  # the gradients made in backward


def test_choose_chunk_size_hand_cases():
    assert choose_chunk_size(272, 10, 10, 10_000, fraction=1.0) is None  # 272 x 20 bytes fit: one call
    # nothing kept, 10 bytes a pass while it runs: 100 passes a call -> 3 calls, evened out to 91
    assert choose_chunk_size(272, 0, 10, 1000, fraction=1.0) == 91
    # 816 bytes kept for backward leave 184: 18 a call -> 16 calls -> 17 each
    assert choose_chunk_size(272, 3, 10, 1000, fraction=1.0) == 17
    assert choose_chunk_size(272, 3, 10, 1000 / 0.9) == 17  # the default leaves 10% headroom
    with pytest.raises(UserError, match="gradient_checkpointing"):
        choose_chunk_size(10, 50, 100, 1000, fraction=0.5)  # the 500 kept bytes fill the budget
    with pytest.raises(ValueError, match="positive"):
        choose_chunk_size(0, 1, 1, 100)
