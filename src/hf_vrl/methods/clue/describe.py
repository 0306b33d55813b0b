"""The description generator of CLUE §4.3 / App. B (Fig. 3c, Fig. 7): a multi-turn dialogue with any
transformers image-text-to-text model, per image:

  role (system)   "You are an expert ..." for the dataset's domain
  (a) global      a summary of the image
  (b) local       the salient parts and their attributes
  (c) condense    one concise description, then light de-duplication (repeated sentences dropped)

Images are described in batches (one `generate` call per step for the whole batch, left padding, greedy
decoding); after every batch the JSON file `{image id: description}` is rewritten atomically, and a rerun
skips the ids it already holds, so a killed run resumes where it stopped. `hf_vrl.methods.clue.text` reads
the file.

    python -m hf_vrl.methods.clue.describe --model <vlm> --dataset cub:/data/CUB_200_2011 \\
        --subject bird --role "You are an ornithologist." --output descriptions.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hf_vrl.devices import module_device, module_dtype, to_device
from hf_vrl.errors import UserError

__all__ = [
    "DescriptionPrompts",
    "conversation",
    "dedupe_sentences",
    "describe_batch",
    "generate_descriptions",
]

STEPS = (
    "Give a global summary of this image: what is the {subject}, and how does it look overall?",
    "List the salient parts of the {subject} and their attributes (shape, colour, texture, pattern, size) "
    "that tell it apart from similar {subject}s.",
    "Condense your observations into one concise description of the {subject} in at most {max_words} "
    "words, keeping the most discriminative details.",
)
ROLE = "You are an expert in fine-grained visual recognition who describes {subject}s precisely."


@dataclass
class DescriptionPrompts:
    """The role and the three steps; `{subject}` and `{max_words}` are filled in."""

    subject: str = "object"
    role: str = ROLE
    steps: tuple[str, ...] = STEPS
    max_words: int = 60

    def text(self, template: str) -> str:
        return template.format(subject=self.subject, max_words=self.max_words)


def conversation(image: Any, prompts: DescriptionPrompts, answers: Sequence[str]) -> list[dict[str, Any]]:
    """The chat up to the next user turn: the role, step 1 with the image, then each answer and next step."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": prompts.text(prompts.role)}]}
    ]
    for step, template in enumerate(prompts.steps[: len(answers) + 1]):
        content = [{"type": "text", "text": prompts.text(template)}]
        if step == 0:
            content.insert(0, {"type": "image", "image": image})
        messages.append({"role": "user", "content": content})
        if step < len(answers):
            messages.append({"role": "assistant", "content": [{"type": "text", "text": answers[step]}]})
    return messages


def dedupe_sentences(text: str) -> str:
    """Light de-duplication: drop sentences that repeat an earlier one (case and spacing ignored)."""
    seen: set[str] = set()
    kept = []
    for sentence in re.split(r"(?<=[.!?])\s+", text.strip()):
        key = " ".join(sentence.lower().split())
        if key and key not in seen:
            seen.add(key)
            kept.append(sentence.strip())
    return " ".join(kept)


@torch.inference_mode()
def _generate(model: Any, processor: Any, chats: list[list[dict]], max_new_tokens: int) -> list[str]:
    padding = {"padding": True}  # transformers 5 takes processor settings in `processor_kwargs`, 4.x directly
    if "processor_kwargs" in inspect.signature(processor.apply_chat_template).parameters:
        padding = {"processor_kwargs": padding}
    inputs = processor.apply_chat_template(
        chats, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt", **padding
    )
    inputs = to_device(dict(inputs), module_device(model), module_dtype(model))
    output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new_tokens = output[:, inputs["input_ids"].shape[1] :]
    return [text.strip() for text in processor.batch_decode(new_tokens, skip_special_tokens=True)]


def describe_batch(
    model: Any, processor: Any, images: Sequence[Any], prompts: DescriptionPrompts, max_new_tokens: int = 128
) -> list[list[str]]:
    """Run the dialogue on a batch of PIL images; per image, the answer to every step (the last is the
    description before de-duplication)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # decoder-only generation continues from the right end
    answers: list[list[str]] = [[] for _ in images]
    try:
        for _ in prompts.steps:
            chats = [
                conversation(image.convert("RGB"), prompts, done) for image, done in zip(images, answers)
            ]
            for done, reply in zip(answers, _generate(model, processor, chats, max_new_tokens)):
                done.append(reply)
    finally:
        tokenizer.padding_side = padding_side
    return answers


def _load(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise UserError(
            f"{path} exists but is not a JSON object of descriptions; move it away or pick another path"
        )
    return data


def _write(path: Path, descriptions: dict[str, str]) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(descriptions, indent=1, ensure_ascii=False) + "\n")
    partial.replace(path)


def _pending(
    dataset: Any, id_column: str, done: dict[str, str], batch_size: int
) -> Iterator[tuple[list[str], list[Any]]]:
    """Batches (ids, images) of the rows not described yet, in dataset order."""
    ids = [str(key) for key in dataset[id_column]]
    todo = [i for i, key in enumerate(ids) if key not in done]
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        yield [ids[i] for i in chunk], dataset.select(chunk)["image"]


def generate_descriptions(
    dataset: Any,
    model: Any,
    processor: Any,
    output: str | Path,
    *,
    prompts: DescriptionPrompts | None = None,
    id_column: str = "key",
    batch_size: int = 8,
    max_new_tokens: int = 128,
) -> dict[str, str]:
    """Describe every image of `dataset` (a map-style dataset with `image` and `id_column`) and write
    `{id: description}` to `output`, resuming from what the file already holds; returns the full mapping."""
    if id_column not in dataset.column_names:
        raise UserError(
            f"the dataset has no {id_column!r} column to key descriptions by; add one or set id_column"
        )
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    prompts = prompts or DescriptionPrompts()
    descriptions = _load(output)
    model.eval()
    for ids, images in _pending(dataset, id_column, descriptions, batch_size):
        answers = describe_batch(model, processor, images, prompts, max_new_tokens)
        descriptions.update({key: dedupe_sentences(steps[-1]) for key, steps in zip(ids, answers)})
        _write(output, descriptions)
    return descriptions


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hf_vrl.methods.clue.describe",
        description="Write CLUE's per-image descriptions (JSON {image id: description}) with an "
        "image-text-to-text model.",
    )
    parser.add_argument("--model", required=True, help="Hub id or folder of an image-text-to-text model")
    parser.add_argument(
        "--dataset", required=True, help="hf_vrl.data registry name or path (cub:<root>, ...)"
    )
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit", type=int, help="describe at most this many images")
    parser.add_argument("--output", required=True, help="JSON file to write (resumed when it exists)")
    parser.add_argument("--id-column", default="key", help="dataset column with the image id")
    parser.add_argument("--subject", default="object", help="what the images show, e.g. bird, car, aircraft")
    parser.add_argument("--role", default=ROLE, help="system prompt; {subject} is filled in")
    parser.add_argument("--max-words", type=int, default=60, help="length limit asked for in step (c)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", help="torch device (default: cuda when available)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from hf_vrl.data.registry import load_dataset_by_name
    from hf_vrl.devices import default_device

    args = _build_parser().parse_args(argv)
    dataset = load_dataset_by_name(args.dataset, split=args.split, limit=args.limit)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype="auto")
    model.to(args.device or default_device())
    processor = AutoProcessor.from_pretrained(args.model)
    prompts = DescriptionPrompts(subject=args.subject, role=args.role, max_words=args.max_words)
    done = generate_descriptions(
        dataset,
        model,
        processor,
        args.output,
        prompts=prompts,
        id_column=args.id_column,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
    )
    print(f"{len(done)} descriptions in {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
