"""The device rule's helpers: read device/dtype off a model, move nested inputs there."""

import torch
from torch import nn
from transformers import BatchEncoding

from hf_vrl.devices import module_device, module_dtype, to_device


def test_module_device_and_dtype_follow_the_model(device):
    model = nn.Linear(2, 2).to(device, torch.float64)
    assert module_device(model).type == device.type
    assert module_dtype(model) == torch.float64
    assert module_device(nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU
    assert module_dtype(nn.ReLU()) == torch.float32


def test_to_device_moves_nested_tensors_and_casts_only_floats(device):
    batch = BatchEncoding(
        {"input_ids": torch.ones(1, 3, dtype=torch.long), "pixel_values": torch.zeros(1, 3)}
    )
    moved = to_device({"batch": batch, "pair": (torch.ones(2), "text"), "n": 3}, device, torch.float16)
    assert isinstance(moved["batch"], dict)
    assert moved["batch"]["input_ids"].device.type == device.type
    assert moved["batch"]["input_ids"].dtype == torch.long  # integer ids are never cast
    assert moved["batch"]["pixel_values"].dtype == torch.float16
    assert moved["pair"][0].device.type == device.type and moved["pair"][1] == "text"
    assert moved["n"] == 3
