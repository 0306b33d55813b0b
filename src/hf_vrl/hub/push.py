"""`hf-vrl push`: publish a run's model, or a model folder hf_vrl saved, to the Hugging Face Hub with its
model card (`hf_vrl.hub.publish`)."""

from __future__ import annotations

import argparse
import math

from hf_vrl.hub.publish import Publication, publish

EPILOG = """examples:
  hf-vrl push runs/diffclip-b16 you/diffclip-b16-cc3m --dry-run
  hf-vrl push runs/dcr you/dcr-clip-l14 --export vision-tower --private
  hf-vrl push runs/dcr you/dcr-clip-l14-tower --what vision-tower
  hf-vrl push converted/diffclip-cc12m you/diffclip-b16-cc12m     # a folder from `hf-vrl convert`

The token comes from `hf auth login` or HF_TOKEN; it is never printed.
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl push",
        description="Upload a finished run's model (weights as safetensors, config, processors, remote code) "
        "with a model card built from its config.json and report.json, the run's record and chosen exports, "
        "in one commit; or a model folder hf_vrl saved outside a run (`hf-vrl convert`), its card built from "
        "what it records.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="the run folder (written by `hf-vrl train`), or a model folder hf_vrl saved (`hf-vrl convert`)",
    )
    parser.add_argument(
        "repo_id", metavar="REPO_ID", help="the Hub repository, owner/name (created if missing)"
    )
    parser.add_argument(
        "--what",
        default="final",
        help="the model at the repo's root: final (default) or an export in <run>/exports/ (DCR: "
        "vision-tower, dcr-model)",
    )
    parser.add_argument(
        "--export",
        action="append",
        default=[],
        dest="exports",
        metavar="NAME",
        help="also upload this export of the run, into exports/<name>/ (repeat for several)",
    )
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", help="the branch to commit to (created if missing; default: main)")
    parser.add_argument(
        "--dry-run", action="store_true", help="stage the upload in a folder and list it; no Hub call"
    )
    parser.add_argument(
        "--staging-dir", help="with --dry-run: where to stage (default: <run>/hub-staging/<owner>--<name>)"
    )
    parser.add_argument("--license", help="card license (default: the base model's, else apache-2.0)")
    parser.add_argument("--base-model", help="card base_model: the Hub id the run started from")
    parser.add_argument("--dataset", action="append", dest="datasets", help="card datasets: a Hub dataset id "
                        "(repeat for several; default: those of the run that are on the Hub)")  # fmt: skip
    parser.add_argument("--commit-message", help="the commit message")
    parser.add_argument(
        "--overwrite-card", action="store_true", help="replace the model card the repository already has"
    )
    return parser


def _size(size: int) -> str:
    """Bytes as B / kB / MB / GB."""
    power = min(int(math.log10(max(size, 1)) // 3), 3)
    return f"{size} B" if power == 0 else f"{size / 1000**power:.1f} {('kB', 'MB', 'GB')[power - 1]}"


def _listing(publication: Publication) -> str:
    lines = [f"  {name:<40} {_size(size):>9}" for name, size in publication.files.items()]
    lines.append(f"  {len(publication.files)} files, {_size(sum(publication.files.values()))}")
    if publication.left_out:
        lines.append(f"  left out: {', '.join(publication.left_out)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    from huggingface_hub import constants

    from hf_vrl.run.preflight import check_finished_run, check_trained_model

    check_trained_model(args.run_dir, "hf-vrl push")
    check_finished_run(args.run_dir, "hf-vrl push")

    if constants.HF_HUB_OFFLINE and not args.dry_run:
        from hf_vrl.errors import UserError

        raise UserError(
            "hf-vrl push uploads to the Hugging Face Hub, but HF_HUB_OFFLINE=1 is set: unset it to upload, "
            "or add --dry-run to see what would be uploaded"
        )
    publication = publish(
        args.run_dir,
        args.repo_id,
        what=args.what,
        exports=args.exports,
        private=args.private,
        revision=args.revision,
        license=args.license,
        base_model=args.base_model,
        datasets=args.datasets,
        commit_message=args.commit_message,
        dry_run=args.dry_run,
        staging_dir=args.staging_dir,
        overwrite_card=args.overwrite_card,
    )
    if args.dry_run:
        print(
            f"would upload to {args.repo_id} (dry run, nothing sent):\n{_listing(publication)}\n"
            f"staged in {publication.staging_dir} (links to the run's files)"
        )
        return 0
    print(f"uploaded to {publication.repo_id}:\n{_listing(publication)}\n{publication.url}")
    return 0
