"""CLUE's text anchors: descriptions from a column or a JSON file, embedded once by a frozen CLIP text tower,
cached on disk."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from clue_helpers import toy_data
from safetensors.torch import save_file
from transformers import AutoConfig, AutoTokenizer, CLIPModel

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.text import build_text_bank, descriptions_of
from hf_vrl.presets import preset_path


@pytest.fixture(scope="module")
def clip():
    torch.manual_seed(0)
    path = preset_path("tiny-clip")
    return CLIPModel(AutoConfig.from_pretrained(path)).eval(), AutoTokenizer.from_pretrained(path)


def test_each_description_is_embedded_once_by_the_text_tower(clip):
    model, tokenizer = clip
    data = toy_data(12)
    texts = descriptions_of(data, "caption")
    bank = build_text_bank(texts, model, tokenizer=tokenizer, text_source="caption")
    assert bank.embeddings.shape == (len(set(texts)), model.config.projection_dim)
    for text in set(texts):
        with torch.no_grad():
            tokens = tokenizer([text], return_tensors="pt", padding=True)
            direct = F.normalize(model.get_text_features(**tokens).pooler_output, dim=-1)[0]
        torch.testing.assert_close(bank.embeddings[bank.index[text]], direct, rtol=1e-5, atol=1e-6)
    rows = [data[i] for i in (3, 0, 3)]
    torch.testing.assert_close(
        bank.embed_rows(rows), bank.embeddings[[bank.index[r["caption"]] for r in rows]]
    )


def test_the_cache_is_written_and_read(clip, tmp_path):
    model, tokenizer = clip
    texts = ["a red circle", "two blue squares", "a red circle"]
    first = build_text_bank(texts, model, tokenizer=tokenizer, cache_dir=tmp_path)
    (cached,) = tmp_path.glob("text_bank-*.safetensors")
    torch.testing.assert_close(first.embeddings, F.normalize(first.embeddings, dim=-1))
    marker = torch.full_like(first.embeddings, 0.5)
    save_file({"embeddings": marker}, cached)  # what the next call returns if it reads the cache
    again = build_text_bank(reversed(texts), model, tokenizer=tokenizer, cache_dir=tmp_path)
    torch.testing.assert_close(again.embeddings, marker)
    other = build_text_bank(["a green star"], model, tokenizer=tokenizer, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("text_bank-*.safetensors"))) == 2 and other.embeddings.shape[0] == 1


def test_a_named_encoder_without_weights_is_a_fixed_random_tower():
    a = build_text_bank(["a red circle", "a blue star"], "tiny-clip", device="cpu")
    b = build_text_bank(["a blue star", "a red circle"], "tiny-clip", device="cpu")
    torch.testing.assert_close(a.embeddings, b.embeddings)
    assert not torch.allclose(a.embeddings[0], a.embeddings[1])


def test_descriptions_from_a_json_file_keyed_by_image_id(clip, tmp_path):
    model, tokenizer = clip
    data = toy_data(4).add_column("key", [f"img{i}.jpg" for i in range(4)])
    path = tmp_path / "descriptions.json"
    path.write_text(json.dumps({f"img{i}.jpg": f"description {i % 2}" for i in range(4)}))
    texts = descriptions_of(data, str(path))
    assert texts == ["description 0", "description 1", "description 0", "description 1"]
    bank = build_text_bank(texts, model, tokenizer=tokenizer, text_source=str(path))
    assert bank.description(data[2]) == "description 0"
    torch.testing.assert_close(bank.embed_rows([data[1]])[0], bank.embeddings[bank.index["description 1"]])
    path.write_text(json.dumps({"img0.jpg": "only one"}))
    with pytest.raises(UserError, match="no description"):
        descriptions_of(data, str(path))
    with pytest.raises(UserError, match="id column"):
        bank.description({"image": None})


def test_clear_errors_for_missing_sources(tmp_path):
    data = toy_data(2)
    with pytest.raises(UserError, match="no 'description' column"):
        descriptions_of(data, "description")
    with pytest.raises(UserError, match="describe"):
        descriptions_of(data, str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="no descriptions"):
        build_text_bank([], "tiny-clip")
