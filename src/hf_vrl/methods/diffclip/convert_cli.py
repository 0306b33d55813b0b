"""`hf-vrl convert diffclip (--official CKPT | --clip ID) --output DIR`: a DiffCLIP model folder (safetensors,
remote code, processors) from a released DiffCLIP checkpoint or from a transformers CLIP, loadable with
`AutoModel.from_pretrained(DIR, trust_remote_code=True)` and the zero-shot pipeline, and publishable with
`hf-vrl push`."""

from __future__ import annotations

import argparse
from pathlib import Path

from hf_vrl.errors import UserError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl convert",
        description="Convert a checkpoint into a DiffCLIP model folder transformers loads.",
    )
    parser.add_argument("model", choices=["diffclip"], help="what to convert into")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--official", metavar="CKPT", help="a released DiffCLIP checkpoint_best.pt")
    source.add_argument("--clip", metavar="ID", help="a transformers CLIPModel: Hub id or folder")
    parser.add_argument(
        "--output", required=True, metavar="DIR", help="the model folder to write (new or empty)"
    )
    parser.add_argument(
        "--tokenizer",
        help="tokenizer to save with the model (default: the CLIP's; with --official: none unless given, "
        "the released models use OpenAI's CLIP BPE, e.g. openai/clip-vit-base-patch16)",
    )
    parser.add_argument(
        "--calibration",
        default=None,
        help="--clip only: data the differential branch is calibrated on (default: the shapes world; "
        "'synthetic': data-free; or a dataset name)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    output = Path(args.output)
    if output.exists() and any(output.iterdir()):
        raise UserError(f"{output} is not empty: give a new or empty folder")
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPProcessor

    from hf_vrl.methods.diffclip.convert import (
        diffclip_from_clip,
        diffclip_from_official_checkpoint,
        slip_image_processor,
    )
    from hf_vrl.models.diffclip import DiffCLIPModel

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else None
    if args.official:
        model = diffclip_from_official_checkpoint(args.official, model_class=DiffCLIPModel)
        image_processor = slip_image_processor(model.config.vision_config.image_size)
    else:
        image_processor = AutoImageProcessor.from_pretrained(args.clip)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(args.clip)
        model = diffclip_from_clip(
            args.clip,
            model_class=DiffCLIPModel,
            calibration_data=args.calibration,
            image_processor=image_processor,
            tokenizer=tokenizer,
        )
    model.save_pretrained(output)
    if tokenizer is not None:
        CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(output)
        tokenizer.save_pretrained(output)
    image_processor.save_pretrained(output)
    report = getattr(model, "conversion_report", None)
    print(f"wrote {output}" + (f" (conversion: {report})" if report else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
