"""Real-size models with random weights: the architectures the paper presets name, built from their real
configurations and saved as local folders in the layout their Hub repositories hold.

`real_configs/<org>--<name>.json` holds, per Hub repository the presets use, the files that define it (each
model's `config.json` with the published architecture values, the processor and pipeline files as published)
and the published size of every weight file, with where each number comes from. `real_size_folder(repo_id)`
builds the folder once (seeded random weights, float32 safetensors as the Hub files are) under
`$HF_VRL_REAL_SIZE_HOME` (default `~/.cache/hf_vrl/real-size`); `parameter_counts` builds the architectures on
the meta device, so a test checks every configuration against its published size without allocating it.

What differs from the Hub repositories: the weights are random; the tokenizers are CLIP-format byte-level BPEs
with CLIP's vocabulary size and special-token ids (`clip_format_tokenizer`) whose merges were learnt on
hf_vrl's toy text, so real words split into more tokens; SigLIP's SentencePiece tokenizer is left out (no
preset tokenizes SigLIP text, and building one needs the sentencepiece package); the pipeline's safety
checker and the `.bin` / fp16 duplicates of the weight files are not written.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hf_vrl.errors import UserError

__all__ = [
    "CLIP_VOCAB_SIZE",
    "catalogue",
    "clip_format_tokenizer",
    "parameter_counts",
    "real_size_folder",
    "real_size_home",
]

REAL_CONFIGS = Path(__file__).parent / "real_configs"
CLIP_VOCAB_SIZE = (
    49408  # CLIP's BPE: 512 byte tokens, 48,894 merges, <|startoftext|> 49406, <|endoftext|> 49407
)
MARKER = "real_size.json"  # written into every built folder: what it is and where its configuration came from


def catalogue() -> dict[str, dict[str, Any]]:
    """{Hub id: its entry in real_configs/} for every repository a paper preset names."""
    entries = (json.loads(path.read_text()) for path in sorted(REAL_CONFIGS.glob("*.json")))
    return {entry["repo_id"]: entry for entry in entries}


def real_size_home() -> Path:
    return Path(os.environ.get("HF_VRL_REAL_SIZE_HOME", Path.home() / ".cache" / "hf_vrl" / "real-size"))


def real_size_folder(repo_id: str, home: Path | None = None) -> Path:
    """The local random-weight copy of `repo_id`, built on first use (atomically: whole or absent)."""
    from hf_vrl.run.layout import atomic_dir

    entries = catalogue()
    if repo_id not in entries:
        raise UserError(
            f"{repo_id} has no real-size configuration in hf_vrl (known: {', '.join(sorted(entries))}); "
            "point the setting at a local model folder instead"
        )
    folder = (home or real_size_home()) / repo_id.replace("/", "--")
    if not (folder / MARKER).is_file():
        with atomic_dir(folder) as staging:
            _build(entries[repo_id], staging)
    return folder


def _build(entry: dict[str, Any], out: Path) -> None:
    for sub, files in entry["folders"].items():
        target = out / sub
        target.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            if name == "tokenizer":
                clip_format_tokenizer(target, pad_token=content["pad_token"])
            elif name == "config.json":
                with torch.random.fork_rng():
                    torch.manual_seed(0)
                    model = build_architecture(content)
                model.save_pretrained(target)
                del model
            else:
                (target / name).write_text(json.dumps(content, indent=2) + "\n")
    marker = {"repo_id": entry["repo_id"], "weights": "random (seed 0)", "source": entry["source"]}
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def build_architecture(config: dict[str, Any]) -> nn.Module:
    """The model a `config.json` describes, randomly initialised on the current default device: a transformers
    class from `architectures`, a diffusers class from `_class_name`."""
    if "_class_name" in config:
        import diffusers

        return getattr(diffusers, config["_class_name"]).from_config(config)
    import transformers
    from transformers import AutoConfig

    settings = {key: value for key, value in config.items() if key != "architectures"}
    model_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    return getattr(transformers, config["architectures"][0])(model_config)


@functools.cache
def parameter_counts(repo_id: str) -> dict[str, int]:
    """{subfolder: parameters} of the weights `repo_id`'s folder holds, built on the meta device."""
    counts = {}
    for sub, files in catalogue()[repo_id]["folders"].items():
        if "config.json" in files:
            with torch.device("meta"):
                model = build_architecture(files["config.json"])
            counts[sub] = sum(p.numel() for p in model.parameters())
    return counts


def clip_format_tokenizer(out_dir: str | os.PathLike, pad_token: str = "<|endoftext|>") -> Any:
    """A `CLIPTokenizer` laid out as OpenAI's (ids 0-511 the bytes in GPT-2's order, "!" first, without and
    with "</w>", then the merges, <|startoftext|> 49406 and <|endoftext|> 49407: the last, highest id, where
    CLIP's text model pools) with CLIP's vocabulary size, saved into `out_dir` with vocab.json and merges.txt
    as the Hub repositories hold them. Its merges are the toy tokenizer's (`hf_vrl.data.tokenizer`); the ids
    between them and the special tokens are placeholders no text produces."""
    from hf_vrl.data.tokenizer import (
        BOS,
        END_OF_WORD,
        EOS,
        _byte_alphabet,
        clip_tokenizer,
        toy_corpus,
        train_bpe,
    )

    _, merges = train_bpe(toy_corpus())
    alphabet = sorted(_byte_alphabet(), key=lambda char: ord(char) > 255)  # printable bytes first, as GPT-2
    vocab: dict[str, int] = {}
    for token in [*alphabet, *(c + END_OF_WORD for c in alphabet), *(a + b for a, b in merges)]:
        vocab.setdefault(token, len(vocab))
    for index in range(len(vocab), CLIP_VOCAB_SIZE - 2):
        vocab[f"<|unused{index}|>"] = index
    vocab[BOS], vocab[EOS] = CLIP_VOCAB_SIZE - 2, CLIP_VOCAB_SIZE - 1
    tokenizer = clip_tokenizer(vocab, merges, pad_token)
    out = Path(out_dir)
    tokenizer.save_pretrained(os.fspath(out))
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return tokenizer
