"""Every method with a batch-coupled loss, over micro-batches: k micro-batches of B give the gradient of one
batch of kB (float64, CPU) with whole-batch accumulation, and not with plain accumulation; the delicate terms
keep their values under bf16 autocast."""

from __future__ import annotations

import pytest
import torch
from clue_helpers import clue_trainer, seeded_rows, tiny_settings
from dive_helpers import model, rows, trainer
from test_accumulation import GradientRecorder, assert_same_gradients, relative_gap
from torch import nn

from hf_vrl.methods.clue.loss import clue_objective
from hf_vrl.methods.dive.settings import DiVESettings


def gradients(run) -> list[dict[str, torch.Tensor]]:
    recorder = GradientRecorder()
    run.add_callback(recorder)
    run.train()
    return recorder.steps


# -- DiVE: L_cl over the target batch, AVL / PVL and m over the reference batch ------------------------------


def dive_run(out_dir, micro: int, steps: int = 1, accumulation: str = "micro_batch", **settings):
    settings = DiVESettings(reference_dataset="rows", reference_batch_size=8, **settings)
    return trainer(
        out_dir,
        settings,
        steps=2,
        batch=micro,
        dual_encoder=model().double(),
        target=rows(16, seed=1),
        reference=rows(16, seed=2),
        gradient_accumulation_steps=steps,
        accumulation=accumulation,
        optim="sgd",
        learning_rate=0.05,
    )


@pytest.mark.parametrize("separate_backward", [True, False])
def test_dive_over_micro_batches_is_dive_over_the_whole_batch(tmp_path, separate_backward):
    """Step 2 (u, v != 0 after step 1): the gradient of L_cl + lambda (AVL + PVL) and m are the batch's."""
    one = dive_run(tmp_path / "one", 8, separate_backward=separate_backward)
    whole = dive_run(tmp_path / "whole", 2, 4, "whole_batch", separate_backward=separate_backward)
    plain = dive_run(tmp_path / "plain", 2, 4, separate_backward=separate_backward)
    want, got, other = gradients(one), gradients(whole), gradients(plain)
    assert [h["avl"] for h in one.state.log_history if "avl" in h][1] > 1e-6  # the term is live at step 2
    for step in range(2):
        assert_same_gradients(got[step], want[step], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(whole.avg_vector, one.avg_vector, rtol=1e-10, atol=1e-14)
    assert relative_gap(other[1], want[1]) > 1e-3  # plain accumulation: 2 pairs per loss, m moved 4 times
    assert int(whole.extra_state()["reference_batches"]) == 2  # one reference batch of B' per step


def test_dive_difference_vectors_are_exactly_zero_at_lr_0_under_bf16(tmp_path):
    """The frozen model runs under the trained model's autocast: at lr = 0 u = v = 0 in bf16 too (before,
    the frozen model ran in fp32 and AVL was 4.5e-5, of the order of the paper's difference vectors)."""
    run = trainer(tmp_path, DiVESettings(reference_dataset="rows"), steps=3, learning_rate=0.0, bf16=True)
    run.train()
    logged = [(h["avl"], h["pvl"], h["diff_norm"]) for h in run.state.log_history if "avl" in h]
    assert len(logged) == 3 and all(value == 0.0 for row in logged for value in row)


def test_dive_bf16_step_is_close_to_the_fp32_step(tmp_path):
    """One step's L_cl and reference term under bf16 autocast against fp32, at a moved model (lr > 0)."""
    logs = {}
    for bf16 in (False, True):
        run = trainer(tmp_path / str(bf16), DiVESettings(reference_dataset="rows"), steps=2, bf16=bf16)
        run.train()
        logs[bf16] = [h for h in run.state.log_history if "avl" in h][1]
    assert logs[True]["avl"] > 0
    for name in ("loss", "avl", "pvl"):
        assert logs[True][name] == pytest.approx(logs[False][name], rel=0.1), name


# -- CLUE: Sinkhorn targets and soft-InfoNCE over the whole batch --------------------------------------------


class _InferenceBatchNorm:
    """Keep BatchNorm layers in inference mode whatever `model.train()` says: BatchNorm normalises each
    micro-batch on its own (the documented difference), so the comparison isolates the loss's coupling."""

    @staticmethod
    def apply(model: nn.Module) -> None:
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
                module.train = lambda mode=True, m=module: m


def clue_run(out_dir, micro: int, steps: int = 1, accumulation: str = "micro_batch"):
    data = seeded_rows(8)
    run = clue_trainer(
        out_dir,
        data,
        steps=1,
        batch=micro,
        settings=tiny_settings(),
        gradient_accumulation_steps=steps,
        accumulation=accumulation,
        train_sampling_strategy="sequential",
    )
    run.model.double()
    _InferenceBatchNorm.apply(run.model)
    collate = run.data_collator
    run.data_collator = lambda batch: {
        k: v.double() if torch.is_floating_point(v) else v for k, v in collate(batch).items()
    }
    return run


def test_clue_over_micro_batches_is_clue_over_the_whole_batch(tmp_path):
    want = gradients(clue_run(tmp_path / "one", 8))[0]
    got = gradients(clue_run(tmp_path / "whole", 2, 4, "whole_batch"))[0]
    other = gradients(clue_run(tmp_path / "plain", 2, 4))[0]
    assert_same_gradients(got, want, rtol=1e-8, atol=1e-10)
    assert relative_gap(other, want) > 1e-3  # Sinkhorn over 2 samples is another target


@pytest.mark.parametrize(("micro", "steps"), [(2, 4), (8, 1)])
def test_batchnorm_normalises_what_the_run_says(tmp_path, micro, steps):
    """What --print-config states is what trains: each BatchNorm call of a CLUE step sees one micro-batch."""
    from hf_vrl.run.batch import batchnorm_sees, plan_batches

    run = clue_trainer(tmp_path, seeded_rows(8), steps=1, batch=micro, settings=tiny_settings(),
                       gradient_accumulation_steps=steps, accumulation="whole_batch")  # fmt: skip
    seen = []
    norm = next(m for m in run.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    norm.register_forward_pre_hook(
        lambda module, args: seen.append(len(args[0])) if module.training else None
    )
    run.train()
    plan = plan_batches(micro, 1, global_batch_size=8)
    assert set(seen) == {micro} and batchnorm_sees(plan, sync=True).startswith(f"{micro} samples")


def test_clue_objective_under_bf16_keeps_fp32_targets():
    """bf16 embeddings (autocast outputs): Sinkhorn and the soft cross-entropies run in fp32, near fp32's."""
    from clue_helpers import objective_inputs

    online, momentum, text = objective_inputs(batch=8)
    full = clue_objective(online, momentum, text_embeds=text)
    half = clue_objective(
        {k: v.bfloat16() for k, v in online.items()},
        {k: v.bfloat16() for k, v in momentum.items()},
        text_embeds=text.bfloat16(),
    )
    for name, value in full.items():
        assert half[name].dtype == torch.float32, name
        torch.testing.assert_close(half[name], value.float(), rtol=1e-3, atol=1e-3, msg=name)


# -- DiffCLIP: the CLIP loss under bf16 autocast -------------------------------------------------------------


def test_diffclip_step_under_bf16_is_close_to_fp32(tmp_path):
    """The model runs under bf16 autocast, its embeddings reach the CLIP loss in fp32 (accelerate converts
    the forward's outputs), so the loss differs from fp32 by the embeddings' rounding only."""
    from dive_helpers import collate, tiny_diffclip

    from hf_vrl.trainer import ContrastiveTrainer, VRLTrainingArguments

    losses = {}
    for bf16 in (False, True):
        args = VRLTrainingArguments(
            output_dir=str(tmp_path / str(bf16)), per_device_train_batch_size=4, accumulation="whole_batch",
            gradient_accumulation_steps=2, max_steps=1, use_cpu=True, report_to="none", bf16=bf16,
            save_strategy="no", logging_steps=1,
            remove_unused_columns=False, train_sampling_strategy="sequential", disable_tqdm=True,
        )  # fmt: skip
        run = ContrastiveTrainer(
            model=tiny_diffclip(), args=args, train_dataset=rows(8, seed=1), data_collator=collate
        )
        run.train()
        losses[bf16] = run.state.log_history[0]["loss"]
    assert losses[True] != losses[False]  # bf16 did run
    assert losses[True] == pytest.approx(losses[False], rel=1e-2)


def test_siglip_sigmoid_loss_over_micro_batches_is_the_whole_batch_loss(tmp_path):
    """SigLIP's sigmoid loss couples every image with every caption, and its bias is a shared output."""
    from dive_helpers import tiny_siglip

    def run(name, micro, steps=1, accumulation="micro_batch"):
        return trainer(
            tmp_path / name, DiVESettings(objective="flyp"), steps=1, batch=micro,
            dual_encoder=tiny_siglip().double(), target=rows(8, seed=1), gradient_accumulation_steps=steps,
            accumulation=accumulation, optim="sgd", learning_rate=0.05,
        )  # fmt: skip

    want = gradients(run("one", 8))[0]
    got = gradients(run("whole", 2, 4, "whole_batch"))[0]
    other = gradients(run("plain", 2, 4))[0]
    assert "logit_bias" in got and "logit_scale" in got
    assert_same_gradients(got, want, rtol=1e-8, atol=1e-10)
    assert relative_gap(other, want) > 1e-3
