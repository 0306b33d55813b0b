"""`hf-vrl llava-align` and `align_projector`: trl's SFTTrainer relearns only the projector, lowers the
held-out caption loss, resumes exactly, and the saved LLaVA reloads with the same outputs."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from llava_helpers import IMAGE_TOKEN, diffclip_tower, tiny_llava, tiny_processor
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import LlavaForConditionalGeneration, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.errors import UserError
from hf_vrl.integrations.llava import load_vision_tower, save_llava, swap_vision_tower
from hf_vrl.integrations.llava_align import (
    PROJECTOR_WEIGHTS,
    ProjectorSFTTrainer,
    _build_parser,
    align_projector,
    caption_pairs,
    freeze_all_but_projector,
    hold_out,
    main,
    resume_point,
    sft_config,
)


def _pairs(processor, n: int = 400, eval_samples: int = 32):
    pairs = caption_pairs(load_dataset_by_name("shapes", limit=n), IMAGE_TOKEN, processor.tokenizer.eos_token)
    return hold_out(pairs, eval_samples, seed=0)


def _options(*extra: str):
    return _build_parser().parse_args(["--llava", "unused", "--output", "unused", *extra])


@pytest.fixture(scope="module")
def trained_llava(tmp_path_factory, tokenizer):
    """A tiny LLaVA trained end to end on shapes captions (a toy of LLaVA's own training), so that its
    language model knows the captions and only the image side is left to align."""
    processor = tiny_processor(tokenizer)
    llava = tiny_llava(tokenizer)
    train, held_out = _pairs(processor, n=1200)
    args = SFTConfig(
        output_dir=str(tmp_path_factory.mktemp("pretrain")),
        max_steps=120,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        activation_checkpointing=False,
        bf16=False,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    SFTTrainer(model=llava, args=args, train_dataset=train, processing_class=processor).train()
    return save_llava(llava, tmp_path_factory.mktemp("trained") / "llava", processor)


def test_llava_align_relearns_the_projector_for_a_tower_of_another_width(trained_llava, tmp_path):
    diffclip_tower(hidden_size=48).save_pretrained(tmp_path / "tower")
    out = tmp_path / "aligned"
    argv = ["--llava", str(trained_llava), "--vision", str(tmp_path / "tower"), "--output", str(out)]
    argv += ["--max-steps", "60", "--batch-size", "16", "--learning-rate", "1e-2", "--eval-samples", "64"]
    argv += ["--max-train-samples", "1000", "--save-steps", "30", "--logging-steps", "30"]
    argv += ["--report-to", "tensorboard"]
    assert main(argv) == 0
    events = EventAccumulator(str(out / "logs"))  # --logging-dir's default: <output>/logs
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [30, 60]

    report = json.loads((out / "llava_align.json").read_text())
    assert report["steps"] == 60 and "hidden width" in report["tower_mismatches"][0]
    # measured: 1.48 -> 1.21 nats per caption token (the trained LLaVA with its own tower: 1.18)
    assert report["eval_loss_after"] < report["eval_loss_before"] - 0.15
    assert not (out / "checkpoints").exists()
    mask = os.umask(0o022)
    os.umask(mask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask  # the umask's (issue 37)

    aligned = LlavaForConditionalGeneration.from_pretrained(out)
    before = LlavaForConditionalGeneration.from_pretrained(trained_llava)
    tower = load_vision_tower(tmp_path / "tower")
    assert aligned.model.multi_modal_projector.linear_1.in_features == 48
    torch.testing.assert_close(aligned.model.vision_tower.state_dict(), tower.state_dict(), rtol=0, atol=0)
    torch.testing.assert_close(
        aligned.model.language_model.state_dict(), before.model.language_model.state_dict(), rtol=0, atol=0
    )
    torch.testing.assert_close(aligned.lm_head.weight, before.lm_head.weight, rtol=0, atol=0)


class StopAt(TrainerCallback):
    """Ends training after `step` steps, as a killed run would (its last checkpoint written)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step == self.step


def test_align_projector_trains_only_the_projector_resumes_exactly_and_reloads(tokenizer, tmp_path):
    processor = tiny_processor(tokenizer)
    train, held_out = _pairs(processor)
    options = _options(
        "--max-steps", "8", "--batch-size", "8", "--save-steps", "4", "--learning-rate", "1e-2"
    )
    initial = tiny_llava(tokenizer)

    def fresh():
        llava = tiny_llava(tokenizer)
        swap_vision_tower(llava, diffclip_tower(), realign=True)
        return llava

    uninterrupted = fresh()
    losses = align_projector(
        uninterrupted, processor, train, held_out, sft_config(options, tmp_path / "a", False)
    )
    assert losses["steps"] == 8
    uninterrupted.cpu()  # the Trainer moved it to the accelerator, if there is one
    torch.testing.assert_close(uninterrupted.model.vision_tower.state_dict(), diffclip_tower().state_dict())
    changed = {
        name
        for name, value in uninterrupted.state_dict().items()
        if not name.startswith("model.vision_tower.") and not torch.equal(value, initial.state_dict()[name])
    }
    assert changed == {
        f"model.multi_modal_projector.linear_{i}.{p}" for i in (1, 2) for p in ("weight", "bias")
    }

    killed = fresh()
    freeze_all_but_projector(killed)
    args = sft_config(options, tmp_path / "b", False)
    trainer = ProjectorSFTTrainer(
        model=killed, args=args, train_dataset=train, processing_class=processor, callbacks=[StopAt(4)]
    )
    trainer.train()
    checkpoint = get_last_checkpoint(str(tmp_path / "b"))
    assert checkpoint.endswith("checkpoint-4")
    assert (tmp_path / "b" / "checkpoint-4" / PROJECTOR_WEIGHTS).is_file()
    assert not list(
        (tmp_path / "b" / "checkpoint-4").glob("model*.safetensors")
    )  # the frozen rest is not saved
    assert (tmp_path / "b" / "checkpoint-4" / "checkpoint.json").is_file()
    damaged = tmp_path / "b" / "checkpoint-8"  # a newer checkpoint whose projector was cut short
    shutil.copytree(tmp_path / "b" / "checkpoint-4", damaged)
    (damaged / PROJECTOR_WEIGHTS).write_bytes((damaged / PROJECTOR_WEIGHTS).read_bytes()[:100])
    assert get_last_checkpoint(str(tmp_path / "b")).endswith("checkpoint-8")  # transformers' unchecked pick
    assert resume_point(tmp_path / "b") == checkpoint  # --resume's: the newest complete one
    resumed = fresh()
    align_projector(resumed, processor, train, held_out, args, resume_from_checkpoint=checkpoint)
    resumed.cpu()
    torch.testing.assert_close(resumed.state_dict(), uninterrupted.state_dict(), rtol=0, atol=0)

    reloaded = LlavaForConditionalGeneration.from_pretrained(save_llava(resumed, tmp_path / "saved")).eval()
    batch = processor(images=list(held_out["image"][:2]), text=[IMAGE_TOKEN] * 2, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, resumed.eval()(**batch).logits, rtol=0, atol=0)


def test_caption_pairs_and_hold_out_for_map_style_and_streamed_data(processor):
    eos = processor.tokenizer.eos_token
    rows = load_dataset_by_name("shapes", limit=10)
    for dataset in (rows, rows.to_iterable_dataset()):
        train, held_out = hold_out(caption_pairs(dataset, "<image>\n", eos), 3, seed=0)
        assert len(held_out) == 3 and set(held_out.column_names) == {"image", "prompt", "completion"}
        first = next(iter(train))
        assert first["prompt"] == "<image>\n" and first["completion"].endswith(eos)
        assert first["completion"].removesuffix(eos) in rows["caption"]
        assert len(list(train)) == 7


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompt", "describe:"], r"--prompt must hold the image token '<image>' exactly once"),
        (["--eval-samples", "0"], r"--eval-samples must be positive"),
        (
            ["--max-train-samples", "64", "--eval-samples", "64"],
            r"--max-train-samples must exceed --eval-samples",
        ),
        (["--warmup-ratio", "1.5"], r"--warmup-ratio must lie in \[0, 1\)"),
    ],
)
def test_llava_align_validates_settings_before_anything_runs(tokenizer, processor, tmp_path, extra, message):
    llava_dir = tmp_path / "llava"
    save_llava(tiny_llava(tokenizer), llava_dir, processor)
    out = tmp_path / "out"
    with pytest.raises(UserError, match=message):
        main(["--llava", str(llava_dir), "--output", str(out), *extra])
    assert not out.exists()
    with pytest.raises(UserError, match="a streamed dataset has no length: set --max-steps"):
        sft_config(_options(), tmp_path / "checkpoints", streamed=True)
