"""Every ablation switch of every method trains on two processes (torchrun, gloo). The runs build DDP with
find_unused_parameters=False, so a parameter that requires a gradient and gets none (a module the
configuration leaves unused) stops the second step with "Expected to have finished reduction in the prior
iteration". Two CLUE rows run in the default suite; the whole matrix is slow (RUN_SLOW=1)."""

from __future__ import annotations

import json

import pytest
from test_run_distributed import QUIET, ok, torchrun

STEPS = ["--max-steps", "2", "--save-steps", "2", *QUIET]  # the failure comes at the second step
CLUE = ["train", "clue", "--config", "clue-tiny", "--backbone-pretrain-steps", "0", "--train-limit", "32",
        "--text-encoder-pretrain-steps", "2",
        "--batch-size", "4", *STEPS]  # fmt: skip
DIVE = ["train", "dive", "--config", "dive-tiny", "--pretrain-steps", "0", "--train-limit", "64",
        "--reference-limit", "32", "--val-size", "0", "--batch-size", "4", *STEPS]  # fmt: skip
DIFFCLIP = ["train", "diffclip", "--train-limit", "32", "--batch-size", "4", *STEPS]
DCR = ["train", "dcr", "--train-limit", "24", "--batch-size", "3", "--stage1-steps", "2",
       "--clip-pretrain-steps", "2", "--diffusion-pretrain-steps", "2", *STEPS]  # fmt: skip

# CLUE Table 2 #1 (InfoNCE: examples/run_clue.py's baseline) and #2 (the text term alone)
INFONCE = ["--targets", "identity", "--beta", "0", "--gamma", "0"]
TEXT_ONLY = ["--alpha", "0", "--beta", "0"]
ABLATIONS = {
    "clue-full": [*CLUE],
    "clue-infonce": [*CLUE, *INFONCE],
    "clue-text-only": [*CLUE, *TEXT_ONLY],
    "clue-identity-targets": [*CLUE, "--targets", "identity"],
    "clue-no-parts": [*CLUE, "--beta", "0"],
    "clue-no-parts-k0": [*CLUE, "--beta", "0", "--num-parts", "0"],
    "clue-no-text": [*CLUE, "--gamma", "0"],
    "clue-global-only": [*CLUE, "--beta", "0", "--gamma", "0"],
    "clue-no-global": [*CLUE, "--alpha", "0"],
    "clue-parts-only": [*CLUE, "--alpha", "0", "--gamma", "0"],
    # whole-batch accumulation under DDP: 2 processes x 2 micro-batches of 4, no sync but on the last
    "clue-text-only-micro-batches": [*CLUE, *TEXT_ONLY, "--global-batch-size", "16"],
    "dive-micro-batches": [*DIVE, "--global-batch-size", "16", "--reference-batch-size", "16"],
    "diffclip-micro-batches": [*DIFFCLIP, "--global-batch-size", "16"],
    **{
        f"dive-{objective}": [*DIVE, "--objective", objective]
        for objective in ("flyp", "dive", "dive_avl", "dive_pvl", "dive_cosine", "flyp_replay", "snd")
    },
    "diffclip": [*DIFFCLIP],
    "diffclip-arch-clip": [*DIFFCLIP, "--arch", "clip"],
    "diffclip-no-diff-attention-in-text": [*DIFFCLIP, "--no-diff-attention-in-text"],
    "diffclip-lambda-depth": [*DIFFCLIP, "--lambda-init-schedule", "depth"],
    "dcr-both": [*DCR],
    "dcr-stage1": [*DCR, "--stage", "1"],
    "dcr-end-to-end": [*DCR, "--stage", "end_to_end"],
    "dcr-reconstruction": [*DCR, "--objective", "reconstruction"],
    "dcr-joint": [*DCR, "--objective", "joint"],
    "dcr-cls": [*DCR, "--condition-mode", "cls"],
    "dcr-cls-patches": [*DCR, "--condition-mode", "cls_patches"],
    "dcr-end-to-end-cls": [*DCR, "--stage", "end_to_end", "--condition-mode", "cls"],
    "dcr-lora-bias": [*DCR, "--lora-bias", "lora_only"],
}
DEFAULT = ("clue-infonce", "clue-text-only-micro-batches")


def _train(name, tmp_path):
    out = tmp_path / "run"
    ok(torchrun([*ABLATIONS[name], "--output-dir", str(out)]))
    assert (out / "final" / "config.json").is_file()
    return out


@pytest.mark.parametrize("name", DEFAULT)
def test_clue_ablation_rows_train_on_two_processes(tmp_path, name):
    out = _train(name, tmp_path)
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["num_parts"] == 0  # beta = 0: no part extractor is built
    assert config["text_embed_dim"] is None if name == "clue-infonce" else config["text_embed_dim"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(ABLATIONS) - set(DEFAULT)))
def test_every_ablation_switch_trains_on_two_processes(tmp_path, name):
    _train(name, tmp_path)
