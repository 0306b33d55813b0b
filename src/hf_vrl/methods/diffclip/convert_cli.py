"""`hf-vrl convert diffclip (--official CKPT | --clip ID) --output-dir DIR`: a DiffCLIP model folder
(safetensors, remote code, processors) from a released DiffCLIP checkpoint or from a transformers CLIP,
loadable with `AutoModel.from_pretrained(DIR, trust_remote_code=True)` and the zero-shot pipeline, and
publishable with `hf-vrl push DIR owner/name`: the folder records what was converted (`conversion.json`: the
source, the base model, the closeness to the source CLIP, and for a released checkpoint its authors' figures),
from which the push builds the model card."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.hub.data_names import is_hub_id, public_path
from hf_vrl.hub.folder import CONVERSION_RECORD
from hf_vrl.hub.publish import portable_files
from hf_vrl.methods.diffclip.paper import RELEASED, released_pretraining, released_results
from hf_vrl.run.layout import OutputDir
from hf_vrl.run.preflight import check_remote_code, check_source

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
        "--output-dir",
        "--output",
        dest="output",
        required=True,
        metavar="DIR",
        help="the model folder to write (new or empty; or one an interrupted `hf-vrl convert` left)",
    )
    parser.add_argument(
        "--tokenizer",
        help="tokenizer to save with the model (default: the CLIP's; with --official: none unless given, "
        "the released models use OpenAI's CLIP BPE, e.g. openai/clip-vit-base-patch16)",
    )
    parser.add_argument(
        "--pretraining-data",
        choices=sorted(RELEASED),
        help="--official only: the released checkpoint's pre-training data, for its card (default: read from "
        "the checkpoint's path, e.g. DiffCLIP_ViTB16_CC12M)",
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
    output = OutputDir(Path(args.output), "convert")
    _check_output(output)
    from transformers import AutoTokenizer, CLIPProcessor

    from hf_vrl.data.processors import load_image_processor
    from hf_vrl.methods.diffclip.convert import diffclip_from_clip
    from hf_vrl.methods.diffclip.official import diffclip_from_official_checkpoint
    from hf_vrl.methods.diffclip.processors import slip_image_processor
    from hf_vrl.models.diffclip import DiffCLIPModel

    check_remote_code(args.clip, "--clip", trusted=False)  # a CLIP loads through transformers' own class
    tokenizer = _tokenizer(args.tokenizer) if args.tokenizer else None
    if args.official:
        try:  # a pickle that would run code, or no SLIP checkpoint: refused before anything is written
            model = diffclip_from_official_checkpoint(args.official, model_class=DiffCLIPModel)
        except ValueError as error:
            raise UserError(f"--official: {(str(error).splitlines() or [''])[0]}") from None
        image_processor = slip_image_processor(model.config.vision_config.image_size)
    else:
        image_processor = load_image_processor(args.clip)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(args.clip)
        model = diffclip_from_clip(
            args.clip,
            model_class=DiffCLIPModel,
            calibration_data=args.calibration,
            image_processor=image_processor,
            tokenizer=tokenizer,
        )
    report = getattr(model, "conversion_report", None)
    with output.claim(), output.staged(replace=True) as folder:  # all files, or none (a full disk: one line)
        _check_output(output)
        model.save_pretrained(folder)
        if tokenizer is not None:
            CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        image_processor.save_pretrained(folder)
        (folder / CONVERSION_RECORD).write_text(json.dumps(conversion_record(args, report), indent=2) + "\n")
        portable_files(folder)  # nothing machine-local in the folder (is_local, local paths)
    print(f"wrote {output.root}" + (f" (conversion: {report})" if report else ""))
    return 0


def _check_output(output: OutputDir) -> None:
    """--output-dir is new, empty, or a folder an interrupted `hf-vrl convert` left (no conversion.json):
    a finished conversion is never replaced."""
    output.check()
    if (output.root / CONVERSION_RECORD).is_file():
        raise UserError(
            f"{output.root} is not empty: it holds a finished conversion; give a new or empty folder"
        )


def _tokenizer(name: str) -> Any:
    """--tokenizer: a folder, a preset folder in hub_configs/ (tiny-clip) or a Hub id; one line naming the
    argument when none of them holds a tokenizer."""
    from transformers import AutoTokenizer

    from hf_vrl.eval_inputs import resolve_model_path

    check_source(name, "--tokenizer")
    try:
        return AutoTokenizer.from_pretrained(resolve_model_path(name))
    except (OSError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"--tokenizer {name}: no tokenizer there ({reason})") from None


def conversion_record(args: argparse.Namespace, report: Any) -> dict[str, Any]:
    """What `conversion.json` records: the source and its Hub id where known, the closeness to the source
    CLIP (`ConversionReport`), and for a released checkpoint its authors' figures."""
    import dataclasses

    import hf_vrl

    record: dict[str, Any] = {"method": "diffclip", "hf_vrl_version": hf_vrl.__version__}
    if args.official:
        pretraining = args.pretraining_data or released_pretraining(args.official)
        record["source"] = {"kind": "official checkpoint", "checkpoint": public_path(args.official)}
        record["base_model"] = f"hammh0a/DiffCLIP_ViTB16_{pretraining}" if pretraining else None
        record["paper_results"] = released_results(pretraining) if pretraining else None
    else:
        record["source"] = {"kind": "transformers CLIP", "checkpoint": public_path(args.clip)}
        record["base_model"] = args.clip if is_hub_id(args.clip) and not Path(args.clip).exists() else None
    record["closeness"] = dataclasses.asdict(report) if report is not None else None
    return record


if __name__ == "__main__":
    raise SystemExit(main())
