"""The toy tokenizer: no CLIP tokenizer ships offline, so a small CLIP-style byte-level BPE is trained on the
text hf_vrl's offline data can produce (shapes-world captions, the class names of every offline set filled
into the caption and zero-shot templates).

It is a real `CLIPTokenizer` (transformers' tokenizers-backed class): CLIP's normalizer (NFC, whitespace,
lowercase), CLIP's pre-tokenizer regex + byte level, "</w>" end-of-word suffix, `<|startoftext|>` and
`<|endoftext|>` around every text, `<|pad|>` for padding, `model_max_length` 77. The vocabulary holds every
byte with and without "</w>", so any text encodes without an unknown token. Training is deterministic:
`build_toy_tokenizer(out_dir)` rewrites `hub_configs/tiny-clip` byte for byte.

Ids: 0 `<|startoftext|>` (bos), 1 `<|endoftext|>` (eos; CLIP pools the text at its first occurrence),
2 `<|pad|>`, then the 256 bytes, the 256 bytes + "</w>", then one token per merge in merge order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from . import offline, toy
from .prompts import CAPTION_TEMPLATES, ZERO_SHOT_TEMPLATES, fill_template_with_article

BOS, EOS, PAD = "<|startoftext|>", "<|endoftext|>", "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)
END_OF_WORD = "</w>"
MODEL_MAX_LENGTH = 77
TRAINER_VOCAB_SIZE = 1200  # merges stop earlier once every corpus word is a single token
TOY_TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "hub_configs" / "tiny-clip"
# CLIP's split regex (transformers CLIPTokenizer): special tokens, contractions, letters, digits, other.
_CLIP_SPLIT = (
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
)


def toy_corpus() -> list[str]:
    """The training text, in a fixed order: shapes-world captions, then every class name of the offline
    sets and the shapes world in every caption and zero-shot template."""
    names = [
        *toy.SHAPES,
        *toy.FINE_CLASSES,
        *offline.FASHION_MNIST_CLASSES,
        *offline.ANIMAL_MNIST_CLASSES,
        *offline.DIGITS_CLASSES,
    ]
    templates = [*CAPTION_TEMPLATES, *ZERO_SHOT_TEMPLATES]
    # the shipped toy tokenizer was trained on the article form ("an owl"); kept so it rebuilds byte for byte
    return toy.caption_vocabulary() + [
        fill_template_with_article(t, name) for name in names for t in templates
    ]


def _byte_alphabet() -> list[str]:
    """The 256 byte-level characters in byte order (GPT-2's bytes_to_unicode)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _clip_pipeline(model: BPE) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_bpe(
    corpus: list[str], vocab_size: int = TRAINER_VOCAB_SIZE
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of a CLIP-style BPE trained on `corpus`, vocab laid out as in the module docstring."""
    trained = _clip_pipeline(BPE(continuing_subword_prefix="", end_of_word_suffix=END_OF_WORD))
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        end_of_word_suffix=END_OF_WORD,
    )
    trained.train_from_iterator(corpus, trainer=trainer)
    merges = [tuple(m) for m in _model_merges(trained)]
    alphabet = _byte_alphabet()
    ordered = [*SPECIAL_TOKENS, *alphabet, *(c + END_OF_WORD for c in alphabet)]
    ordered += [a + b for a, b in merges]
    vocab: dict[str, int] = {}
    for token in ordered:
        vocab.setdefault(token, len(vocab))
    return vocab, merges


def _model_merges(tokenizer: Tokenizer) -> list[list[str]]:
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [m.split(" ") if isinstance(m, str) else m for m in merges]


def clip_tokenizer(vocab: dict[str, int], merges: list, pad_token: str = PAD) -> Any:
    """A transformers `CLIPTokenizer` of `vocab` and `merges` with CLIP's special tokens and length."""
    from transformers import CLIPTokenizer

    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=EOS,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=pad_token,
        model_max_length=MODEL_MAX_LENGTH,
    )


def build_toy_tokenizer(out_dir: str | os.PathLike = TOY_TOKENIZER_DIR, vocab_size: int = TRAINER_VOCAB_SIZE):
    """Train the toy tokenizer, save it into `out_dir` (tokenizer.json, tokenizer_config.json, ...) and
    return it as a transformers `CLIPTokenizer`."""
    vocab, merges = train_bpe(toy_corpus(), vocab_size)
    tokenizer = clip_tokenizer(vocab, merges)
    tokenizer.save_pretrained(os.fspath(out_dir))
    return tokenizer


def write_image_processor_config(
    out_dir: str | os.PathLike = TOY_TOKENIZER_DIR, image_size: int = 32
) -> Path:
    """Write preprocessor_config.json for a CLIPImageProcessor at `image_size` (resize the shortest edge,
    center crop, CLIP mean/std); loads with AutoImageProcessor, with or without torchvision."""
    config = {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": image_size},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": image_size, "width": image_size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(OPENAI_CLIP_MEAN),
        "image_std": list(OPENAI_CLIP_STD),
        "do_convert_rgb": True,
    }
    path = Path(out_dir) / "preprocessor_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def load_toy_tokenizer(path: str | os.PathLike = TOY_TOKENIZER_DIR):
    """The saved toy tokenizer (`AutoTokenizer.from_pretrained(path)`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.fspath(path))
