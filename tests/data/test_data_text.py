"""The toy tokenizer, the tiny-clip processor files, the prompts and the collator."""

import json
import random
import re

import numpy as np
import pytest
import torch
from transformers import AutoImageProcessor, AutoTokenizer, SiglipImageProcessor

from hf_vrl.data.collate import ImageTextCollator
from hf_vrl.data.prompts import CAPTION_TEMPLATES, ZERO_SHOT_TEMPLATES, caption_for, captions_for_labels
from hf_vrl.data.tokenizer import (
    BOS,
    END_OF_WORD,
    EOS,
    PAD,
    TOY_TOKENIZER_DIR,
    build_toy_tokenizer,
    toy_corpus,
    train_bpe,
    write_image_processor_config,
)
from hf_vrl.data.toy import shapes_dataset

pytestmark = pytest.mark.filterwarnings("ignore:.*requires torchvision")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOY_TOKENIZER_DIR)


@pytest.fixture(scope="module")
def image_processor():
    return AutoImageProcessor.from_pretrained(TOY_TOKENIZER_DIR)


def test_saved_files_are_what_the_builder_writes(tmp_path):
    build_toy_tokenizer(tmp_path)
    write_image_processor_config(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        assert (tmp_path / name).read_bytes() == (TOY_TOKENIZER_DIR / name).read_bytes(), name


def test_special_ids_and_wrapping(tokenizer):
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (BOS, EOS, PAD)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 2)
    assert tokenizer.model_max_length == 77 and type(tokenizer).__name__ == "CLIPTokenizer"
    ids = tokenizer("two small red circles at the top left")["input_ids"]
    assert ids[0] == 0 and ids[-1] == 1 and len(ids) == 10  # every corpus word is one token
    assert tokenizer("")["input_ids"] == [0, 1]


def test_any_text_encodes_without_unknowns_and_round_trips(tokenizer):
    vocab = tokenizer.get_vocab()
    assert len(vocab) == len(tokenizer) and 700 <= len(vocab) <= 2000
    text = "Zürich café: 3 ÉMOJI 🐱 <html> tab\there"
    ids = tokenizer(text)["input_ids"]
    assert 1 not in ids[1:-1]  # the unknown token (= eos) never appears inside
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded.replace(" ", "") == text.lower().replace(" ", "").replace("\t", "")


def test_truncation_keeps_eos(tokenizer):
    batch = tokenizer(["word " * 200, "red"], padding="max_length", truncation=True, max_length=77)
    assert [len(x) for x in batch["input_ids"]] == [77, 77]
    assert batch["input_ids"][0][-1] == 1 and batch["input_ids"][1][:3] == [0, batch["input_ids"][1][1], 1]
    assert batch["input_ids"][1][3:] == [2] * 74 and sum(batch["attention_mask"][1]) == 3


def test_training_is_deterministic_and_learns_every_corpus_word(tokenizer):
    corpus = toy_corpus()
    vocab, merges = train_bpe(corpus)
    assert (vocab, merges) == train_bpe(corpus)
    assert tokenizer.get_vocab() == vocab
    assert len(vocab) == 3 + 2 * 256 + len(merges)  # specials, bytes, bytes + </w>, one token per merge
    assert (
        sum(len(t) == 1 for t in vocab) == 256
        and sum(len(t) == 5 and t.endswith(END_OF_WORD) for t in vocab) == 256
    )
    words = {w for sentence in corpus for w in re.findall(r"[a-z]+", sentence)}
    for word in words:
        assert tokenizer.tokenize(word) == [word + END_OF_WORD]


def test_image_processor_is_a_32px_clip_processor(image_processor):
    assert type(image_processor).__name__.startswith("CLIPImageProcessor")
    out = image_processor(images=[shapes_dataset(1, image_size=64)[0]["image"]], return_tensors="pt")
    assert out["pixel_values"].shape == (1, 3, 32, 32)
    config = json.loads((TOY_TOKENIZER_DIR / "preprocessor_config.json").read_text())
    assert config["size"] == {"shortest_edge": 32} and config["crop_size"] == {"height": 32, "width": 32}


def test_collator_batch_contract(tokenizer, image_processor):
    rows = list(shapes_dataset(5, image_size=48))
    batch = ImageTextCollator(image_processor, tokenizer)(rows)
    assert set(batch) == {"pixel_values", "input_ids", "attention_mask", "class_labels"}
    assert batch["pixel_values"].shape == (5, 3, 32, 32) and batch["pixel_values"].dtype == torch.float32
    assert (
        batch["input_ids"].dtype == batch["attention_mask"].dtype == batch["class_labels"].dtype == torch.long
    )
    longest = max(len(tokenizer(r["caption"])["input_ids"]) for r in rows)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (5, longest)  # padded to the longest
    assert batch["class_labels"].tolist() == [r["label"] for r in rows]
    first_eos = (batch["input_ids"] == tokenizer.eos_token_id).int().argmax(-1)
    assert torch.equal(first_eos + 1, batch["attention_mask"].sum(-1))  # CLIP pools at the first eos
    expected = image_processor(images=[r["image"] for r in rows], return_tensors="pt")["pixel_values"]
    assert torch.equal(batch["pixel_values"], expected)


def test_collator_siglip_style_pads_to_max_length_without_mask(tokenizer):
    siglip_like = AutoTokenizer.from_pretrained(TOY_TOKENIZER_DIR, model_max_length=64)
    siglip_like.model_input_names = ["input_ids"]  # what SiglipTokenizer declares
    processor = SiglipImageProcessor(size={"height": 32, "width": 32})
    rows = [{"image": r["image"], "caption": r["caption"]} for r in shapes_dataset(3)]
    batch = ImageTextCollator(processor, siglip_like)(rows)
    assert batch["input_ids"].shape == (3, 64) and batch["attention_mask"].eq(1).all()
    assert batch["class_labels"].tolist() == [-1, -1, -1] and batch["pixel_values"].shape == (3, 3, 32, 32)


def test_collator_errors(tokenizer, image_processor):
    collator = ImageTextCollator(image_processor, tokenizer)
    with pytest.raises(KeyError, match="caption"):
        collator([{"image": shapes_dataset(1)[0]["image"], "text": "x"}])
    with pytest.raises(ValueError, match="empty batch"):
        collator([])


def test_prompts():
    assert caption_for("cat", 0) == "a photo of a cat." and caption_for("owl", 0) == "a photo of a owl."
    assert caption_for("cat", len(CAPTION_TEMPLATES) + 1) == caption_for("cat", 1)
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    assert caption_for("cat", rng_a) == caption_for("cat", rng_b)
    assert caption_for("cat", random.Random(1)) in {t.format("cat") for t in CAPTION_TEMPLATES}
    assert captions_for_labels([0, 1, 0], ["cat", "dog"], 7) == captions_for_labels(
        [0, 1, 0], ["cat", "dog"], 7
    )
    assert all("{}" in t for t in ZERO_SHOT_TEMPLATES) and len(ZERO_SHOT_TEMPLATES) == 8
    with pytest.raises(TypeError):
        caption_for("cat", 1.5)


def test_training_captions_and_evaluation_prompts_fill_templates_the_same_way():
    """One rule, FLYP's and CLIP's: templates filled verbatim ("a photo of a owl."), in the captions of
    labelled images, DiVE's FLYP captions and the default (clip_benchmark) zero-shot prompts; the article
    rewriting is the "hf_vrl" protocol's named option only."""
    from hf_vrl.data.prompts import fill_template, fill_template_with_article
    from hf_vrl.evaluation import zero_shot_prompts
    from hf_vrl.methods.dive.data import class_captions

    names = ["owl", "apple", "cat"]
    verbatim = [t.format(n) for n in names for t in CAPTION_TEMPLATES]
    evaluation_fill = zero_shot_prompts().fill
    assert [evaluation_fill(t, n) for n in names for t in CAPTION_TEMPLATES] == verbatim
    assert [fill_template(t, n) for n in names for t in CAPTION_TEMPLATES] == verbatim
    assert [caption_for(n, i) for n in names for i in range(len(CAPTION_TEMPLATES))] == verbatim
    k = len(CAPTION_TEMPLATES)
    dive = class_captions(
        [y for y in range(3) for _ in range(k)], names, CAPTION_TEMPLATES, list(range(k)) * 3
    )
    assert dive == verbatim
    assert set(captions_for_labels([0, 1, 2] * 20, names, 0)) <= set(verbatim)
    assert fill_template_with_article("a photo of a {}.", "owl") == "a photo of an owl."
    assert zero_shot_prompts("hf_vrl").fill is fill_template_with_article
