"""Fixtures for the LLaVA tests: the toy tokenizer with `<image>`, a tiny LLaVA and its processor,
shapes-world image-caption pairs."""

from __future__ import annotations

import pytest
from llava_helpers import tiny_llava, tiny_processor, toy_tokenizer

from hf_vrl.data.registry import load_dataset_by_name


@pytest.fixture(scope="session")
def tokenizer():
    return toy_tokenizer()


@pytest.fixture
def processor(tokenizer):
    return tiny_processor(tokenizer)


@pytest.fixture
def llava(tokenizer):
    return tiny_llava(tokenizer)


@pytest.fixture(scope="session")
def shapes():
    return load_dataset_by_name("shapes", limit=8, seed=1)
