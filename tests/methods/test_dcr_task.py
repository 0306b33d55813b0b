"""DCRTask: the batched B^2 grid equals Algorithm 1's per-anchor loop; negatives, baselines, input checks, the
device rule; DCRCollator: the official crop of the original image, seeded per sample."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hf_vrl.methods.dcr.diffusion import load_diffusion, tiny_diffusion
from hf_vrl.methods.dcr.loss import reconstruction_loss, supervised_contrastive_loss
from hf_vrl.methods.dcr.task import DCRCollator, DCRTask, DCRTaskConfig
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel


@pytest.fixture(scope="module")
def diffusion(tmp_path_factory):
    return load_diffusion(tiny_diffusion(tmp_path_factory.mktemp("sd")), dtype="float32")


@pytest.fixture
def model():
    return DCRModel.from_clip(tiny_clip(), condition_dim=16)


def _task(model, diffusion, **kwargs) -> DCRTask:
    return DCRTask(model, diffusion, DCRTaskConfig(**kwargs))


def algorithm1_loss(task: DCRTask, step) -> float:
    """Algorithm 1, lines 4-20, one UNet call per prediction and Eq. 12 with python floats."""
    unet, tau = task.diffusion.unet, task.config.temperature
    batch = len(step.noisy)
    cond, cond_pos = step.conditions[:batch], step.conditions[batch:]

    def eps(i, c):
        return unet(step.noisy[i : i + 1], step.timesteps[i : i + 1], encoder_hidden_states=c[None]).sample[0]

    def d(u, v):
        return math.exp(F.cosine_similarity(u.flatten(), v.flatten(), dim=0).item() / tau)

    total = 0.0
    for i in range(batch):
        anchor = eps(i, cond[i])
        positives = [eps(i, cond_pos[i]), step.target[i]]
        negatives = [eps(i, cond[j]) for j in range(batch) if j != i]
        denominator = sum(d(anchor, c) for c in positives + negatives)
        total += -0.5 * sum(math.log(d(anchor, p) / denominator) for p in positives)
    return total / batch


@pytest.mark.parametrize("chunk", [None, 3])
def test_batched_grid_equals_algorithm1(model, diffusion, chunk):
    task = _task(model, diffusion, unet_chunk_size=chunk).train()
    torch.manual_seed(0)
    step = task.prepare_step(torch.rand(4, 3, 16, 16))
    assert step.conditions.shape == (8, 77, 16)  # [c_1..c_B, c+_1..c+_B] from one encoder call
    out = task.dcr_objective(step)
    with torch.no_grad():
        assert out["loss"].item() == pytest.approx(algorithm1_loss(task, step), rel=1e-4)
    assert set(out) == {"loss", "sim_positive", "sim_target", "sim_negative", "contrastive_acc", "recon_mse"}


def test_subsampled_negatives(model, diffusion):
    task = _task(model, diffusion, num_negatives=2)
    columns, anchor = task.negative_columns(6, torch.device("cpu"))
    assert anchor == 0 and columns.shape == (6, 3)
    assert torch.equal(columns[:, 0], torch.arange(6))
    for row, cols in enumerate(columns.tolist()):
        assert row not in cols[1:] and len(set(cols)) == 3
    full, none = task.negative_columns(3, torch.device("cpu"))  # K >= B-1: the whole batch
    assert none is None and torch.equal(full, torch.arange(3).expand(3, 3))
    task.train()
    torch.manual_seed(0)
    out = task(torch.rand(6, 3, 16, 16))
    assert torch.isfinite(out["loss"]) and out["loss"].requires_grad


def test_target_option_changes_the_positive(model, diffusion):
    images = torch.rand(3, 3, 16, 16)
    steps = {}
    for target in ("epsilon", "v_prediction"):
        task = _task(model, diffusion, target=target).eval()
        torch.manual_seed(0)
        steps[target] = task.prepare_step(images)
    latents_noise = steps["epsilon"].target  # eps
    assert not torch.allclose(steps["v_prediction"].target, latents_noise)
    torch.testing.assert_close(steps["v_prediction"].noisy, steps["epsilon"].noisy)


def test_reconstruction_and_joint_objectives(model, diffusion):
    images = torch.rand(4, 3, 16, 16)
    rec = _task(model, diffusion, objective="reconstruction").train()
    out = rec(images)
    assert set(out) == {"loss", "recon_mse"}
    joint = _task(model, diffusion, objective="joint", lambda_con=0.5, lambda_rec=2.0).train()
    out = joint(images)
    assert out["loss"].item() == pytest.approx(
        0.5 * out["loss_con"].item() + 2.0 * out["loss_rec"].item(), rel=1e-5
    )
    assert -1.0 <= out["grad_cos"].item() <= 1.0  # Eq. 11, the encoder is trainable here
    model.requires_grad_(False)
    model.projector.requires_grad_(True)
    assert "grad_cos" not in joint(images)  # stage 1: z carries no gradient, no diagnostic


def test_input_checks(model, diffusion):
    task = _task(model, diffusion)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        task(torch.rand(2, 3, 16, 16) * 4 - 2)
    with pytest.raises(ValueError, match="B, 3, H, W"):
        task(torch.rand(3, 16, 16))
    wide = DCRModel.from_clip(tiny_clip(), condition_dim=32)
    with pytest.raises(ValueError, match="condition_dim=16"):
        DCRTask(wide, diffusion)
    with pytest.raises(ValueError, match="objective"):
        DCRTaskConfig(objective="mse")
    with pytest.raises(ValueError, match="num_negatives"):
        DCRTaskConfig(num_negatives=0)


def test_null_text_embedding_is_installed(model, diffusion):
    _task(model, diffusion)
    assert torch.equal(model.null_text_embeds, diffusion.null_text_embeds)


def _strip_image():
    from PIL import Image

    image = Image.new("RGB", (40, 20), (255, 0, 0))
    image.paste((0, 0, 255), (0, 0, 10, 20))  # blue strip on the left quarter
    return image


def test_collator_centre_crops_to_unit_range():
    out = DCRCollator(8, crop_scale=None)([{"image": _strip_image()}, {"image": _strip_image()}])[
        "pixel_values"
    ]
    assert out.shape == (2, 3, 8, 8) and out.min() >= 0 and out.max() <= 1
    torch.testing.assert_close(out[0, :, 4, 4], torch.tensor([1.0, 0.0, 0.0]), atol=1e-3, rtol=0)
    assert out[0, 2, :, 0].max() < 0.05  # the strip is cropped away
    with pytest.raises(ValueError, match="image"):
        DCRCollator(8)([{"caption": "x"}])
    with pytest.raises(ValueError, match="crop_scale"):
        DCRCollator(8, crop_scale=(0.0, 1.0))


def test_collator_crops_the_original_image():
    """Official: RandomResizedCrop on the full, non-square image (here scale 1 at the image's own 2:1 ratio:
    the whole image, squeezed to S x S), not on a centre-cropped square."""
    collate = DCRCollator(8, crop_scale=(1.0, 1.0), crop_ratio=(2.0, 2.0))
    out = collate([{"image": _strip_image()}])["pixel_values"][0]
    torch.testing.assert_close(out[:, 4, 0], torch.tensor([0.0, 0.0, 1.0]), atol=1e-3, rtol=0)  # strip kept
    torch.testing.assert_close(out[:, 4, 7], torch.tensor([1.0, 0.0, 0.0]), atol=1e-3, rtol=0)


def _noise_rows(n: int, seeded: bool):
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        pixels = (torch.rand(50, 50, 3, generator=generator) * 255).byte().numpy()
        rows.append({"image": Image.fromarray(pixels)} | ({"sample_seed": 1000 + i} if seeded else {}))
    return rows


def test_collator_crop_is_a_function_of_the_sample_seed():
    rows = _noise_rows(4, seeded=True)
    collate = DCRCollator(16)
    first = collate(rows)["pixel_values"]
    torch.manual_seed(123)  # the global RNG plays no part
    again = collate(rows[::-1])["pixel_values"].flip(0)  # another order, another batch position
    assert torch.equal(first, again)
    other = collate([row | {"sample_seed": 7} for row in rows])["pixel_values"]
    assert not torch.equal(first, other)
    centre = DCRCollator(16, crop_scale=None)(rows)["pixel_values"]
    assert not torch.equal(first, centre)
    unseeded = _noise_rows(4, seeded=False)  # no sample_seed: torch's global RNG
    torch.manual_seed(5)
    a = collate(unseeded)["pixel_values"]
    torch.manual_seed(5)
    assert torch.equal(a, collate(unseeded)["pixel_values"])


def test_collator_crops_agree_across_dataloader_workers():
    from torch.utils.data import DataLoader

    rows = _noise_rows(6, seeded=True)
    collate = DCRCollator(16)
    batches = [
        torch.cat(
            [b["pixel_values"] for b in DataLoader(rows, batch_size=2, collate_fn=collate, num_workers=w)]
        )
        for w in (0, 2)
    ]
    assert torch.equal(*batches)


def test_task_follows_the_model_device(model, diffusion, device):
    """Images on the CPU, model and frozen diffusion on `device`: the step runs there (the device rule)."""
    task = _task(model, diffusion).to(device).train()
    try:
        torch.manual_seed(0)
        out = task(torch.rand(3, 3, 16, 16))
        assert out["loss"].device.type == device.type and torch.isfinite(out["loss"])
        out["loss"].backward()
    finally:
        task.to("cpu")


def test_joint_gradient_cosine_uses_the_clean_rows(model, diffusion):
    """Eq. 11 over z of the clean views: L_rec has no gradient on the augmented half."""
    task = _task(model, diffusion, objective="joint").train()
    torch.manual_seed(0)
    step = task.prepare_step(torch.rand(4, 3, 16, 16))
    pred = task.diffusion.predict(step.noisy, step.timesteps, step.conditions[:4])
    loss_rec = task_loss = reconstruction_loss(pred, step.target)
    labels = torch.arange(4).repeat(2)
    loss_con = supervised_contrastive_loss(step.embeds, labels, 0.1)
    g_con, g_rec = (
        torch.autograd.grad(loss, step.embeds, retain_graph=True)[0] for loss in (loss_con, task_loss)
    )
    assert g_rec[4:].abs().max() == 0  # the augmented half
    expected = F.cosine_similarity(g_con[:4].flatten(), g_rec[:4].flatten(), dim=0)
    out = task._joint(step.embeds, loss_rec, loss_rec.detach())
    assert out["grad_cos"].item() == pytest.approx(expected.item(), rel=1e-4)
    all_rows = F.cosine_similarity(g_con.flatten(), g_rec.flatten(), dim=0)
    assert abs(out["grad_cos"].item()) > abs(all_rows.item())  # the all-row value is shrunk


def test_reconstruction_reduction_option(model, diffusion):
    images = torch.rand(3, 3, 16, 16)
    losses = {}
    for reduction in ("sum", "mean"):
        task = _task(model, diffusion, objective="reconstruction", reconstruction_reduction=reduction).train()
        torch.manual_seed(0)
        losses[reduction] = task(images)["loss"].item()
    latent_values = 4 * 8 * 8  # D of a 16-px image's latent
    assert losses["sum"] == pytest.approx(losses["mean"] * latent_values, rel=1e-5)  # Eq. 8 vs DIVA's mean
    with pytest.raises(ValueError, match="reconstruction_reduction"):
        DCRTaskConfig(reconstruction_reduction="max")
    with pytest.raises(ValueError, match="unet_chunk_size"):
        DCRTaskConfig(unet_chunk_size="all")
    assert DCRTaskConfig(unet_chunk_size="auto").unet_chunk_size == "auto"
