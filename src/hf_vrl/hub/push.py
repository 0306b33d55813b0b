"""`hf-vrl push`: publish a run's model to the Hugging Face Hub with its model card (`hf_vrl.hub.publish`)."""

from __future__ import annotations

import argparse
import math

from hf_vrl.hub.publish import Publication, publish

EPILOG = """examples:
  hf-vrl push runs/diffclip-b16 --repo-id you/diffclip-b16-cc3m --dry-run
  hf-vrl push runs/dcr --repo-id you/dcr-clip-l14 --what vision-tower --private

The token comes from `hf auth login` or HF_TOKEN; it is never printed.
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl push",
        description="Upload a finished run's model (weights as safetensors, config, processors, remote code) "
        "with a model card built from its config.json and report.json, in one commit.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", help="the run folder (written by `hf-vrl train`)")
    parser.add_argument(
        "--repo-id", required=True, help="the Hub repository, owner/name (created if missing)"
    )
    parser.add_argument(
        "--what",
        default="final",
        help="which model of the run: final (default) or an export in <run>/exports/ (DCR: vision-tower, "
        "dcr-model)",
    )
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument(
        "--overwrite-card", action="store_true", help="replace the repository's README.md if it has one"
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would be uploaded; no Hub call")
    parser.add_argument("--license", help="card license (default: the base model's, else apache-2.0)")
    parser.add_argument("--base-model", help="card base_model: the Hub id the run started from")
    parser.add_argument("--dataset", action="append", dest="datasets", help="card datasets: a Hub dataset id "
                        "(repeat for several; default: those of the run that are on the Hub)")  # fmt: skip
    parser.add_argument("--commit-message", help="the commit message")
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
    publication = publish(
        args.run_dir,
        args.repo_id,
        what=args.what,
        private=args.private,
        overwrite_card=args.overwrite_card,
        license=args.license,
        base_model=args.base_model,
        datasets=args.datasets,
        commit_message=args.commit_message,
        dry_run=args.dry_run,
    )
    if args.dry_run:
        print(f"would upload to {args.repo_id} (dry run, nothing sent):\n{_listing(publication)}")
        return 0
    print(f"uploaded to {publication.repo_id}:\n{_listing(publication)}\n{publication.url}")
    return 0
