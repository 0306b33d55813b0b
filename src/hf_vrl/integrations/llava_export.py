"""`hf-vrl export-llava`: put an enhanced vision tower into a LLaVA and save the result.

    hf-vrl export-llava --llava llava-hf/llava-1.5-7b-hf --vision runs/dcr/exports/vision-tower \\
        --output-dir runs/llava-dcr

`--vision` is a tower folder (DCR / DiVE export, DiffCLIP vision model, CLUE ViT backbone) or a dual encoder
(CLIPModel, DiffCLIPModel: its vision tower is taken). The tower must give the projector's width and the image
tokens the language model was trained on; where it does not, the command says what differs and
`hf-vrl llava-align` relearns the projector instead. The output holds the model (dtype of `--llava`) and the
processor updated for the tower (its own image processor when `--vision` has one). The output folder is new,
empty or an earlier `hf-vrl export-llava`'s (`hf_vrl.run.layout.OutputDir`), replaced whole under its lock.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_vrl.run.layout import OutputDir

STRATEGIES = ("default", "full")


def feature_layer(text: str) -> int | list[int]:
    """`-2` -> -2, `-24,-18,-12` -> [-24, -18, -12] (argparse type)."""
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or comma-separated integers, got {text!r}"
        ) from None
    return layers[0] if len(layers) == 1 else layers


def add_tower_arguments(parser: argparse.ArgumentParser, *, vision_required: bool, output_help: str) -> None:
    """The options both LLaVA commands share: the LLaVA, the tower, LLaVA's feature selection, the output."""
    parser.add_argument("--llava", required=True, help="LlavaForConditionalGeneration folder or Hub id")
    parser.add_argument(
        "--vision",
        required=vision_required,
        help="vision tower folder or Hub id (a tower, or a CLIPModel / DiffCLIPModel whose tower is taken)",
    )
    parser.add_argument("--output-dir", "--output", dest="output", required=True, help=output_help)
    parser.add_argument(
        "--vision-feature-layer",
        type=feature_layer,
        help="hidden state(s) LLaVA feeds the projector (0 = embeddings, -2 = penultimate block; a comma "
        "list concatenates several); default: the LLaVA's",
    )
    parser.add_argument(
        "--vision-feature-select-strategy",
        choices=STRATEGIES,
        help="'default' drops the CLS token, 'full' keeps every token (towers without CLS, e.g. SigLIP); "
        "default: the LLaVA's",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl export-llava",
        description="Put an enhanced vision tower into a LLaVA (transformers LlavaForConditionalGeneration).",
        epilog="A tower of another width or patch grid needs its projector relearned: hf-vrl llava-align. "
        "Flags take either spelling (--output-dir, --output_dir), as in hf-vrl train.",
    )
    add_tower_arguments(parser, vision_required=True, output_help="folder for the LLaVA with the new tower")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="dtype of the written model; the tower is cast to it (default: auto, the LLaVA checkpoint's)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    options = _build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    output = OutputDir(Path(options.output), "export-llava")
    output.check()  # before anything loads: a folder this command must not write is one line
    from hf_vrl.integrations.llava import (
        llava_processor_for,
        load_image_processor,
        load_llava,
        load_llava_processor,
        load_vision_tower,
        save_llava,
        swap_vision_tower,
    )

    llava = load_llava(options.llava, dtype=options.dtype)
    processor = load_llava_processor(options.llava)
    tower = load_vision_tower(options.vision)
    features = {
        "vision_feature_layer": options.vision_feature_layer,
        "vision_feature_select_strategy": options.vision_feature_select_strategy,
    }
    fit = swap_vision_tower(llava, tower, **features)
    if processor is not None:
        processor = llava_processor_for(llava, processor, load_image_processor(options.vision))
    with output.claim(), output.staged(replace=True) as folder:
        save_llava(llava, folder, processor)
    print(f"{options.output}: {options.llava} with the vision tower of {options.vision}")
    print(f"  tower: {fit.tower.describe()}, {fit.tower.feature_width}-wide features")
    for note in fit.notes:
        print(f"  {note}")
    if processor is None:
        print(f"  {options.llava} has no LLaVA processor: only the model was written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
