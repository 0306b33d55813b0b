"""DiVETrainer: every objective trains; the frozen model gets no gradient and is never saved; m and the
reference position survive resume exactly; separate and joint backward agree; the cache is exact; SigLIP and
DiffCLIP train too."""

from __future__ import annotations

import math

import pytest
import torch
from dive_helpers import SGD, collate, model, rows, tiny_diffclip, tiny_siglip, trainer
from safetensors.torch import load_file
from transformers import TrainingArguments

from hf_vrl.errors import UserError
from hf_vrl.methods.dive.settings import HEAD_OBJECTIVES, OBJECTIVES, DiVESettings
from hf_vrl.methods.dive.sigmoid_loss import sigmoid_contrastive_loss
from hf_vrl.methods.dive.trainer import DiVETrainer
from hf_vrl.trainer import EXTRA_STATE_NAME


def settings(**kwargs) -> DiVESettings:
    return DiVESettings(**({"reference_dataset": "tensor rows"} | kwargs))


def logged(run, key: str) -> list[float]:
    return [entry[key] for entry in run.state.log_history if key in entry]


def assert_same_weights(a, b, **tolerance):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, msg=name, **tolerance)


@pytest.mark.parametrize("objective", sorted(set(OBJECTIVES) - HEAD_OBJECTIVES))
def test_every_objective_trains_and_leaves_the_frozen_model_alone(tmp_path, objective):
    run = trainer(tmp_path, settings(objective=objective), steps=3)
    frozen_before = (
        None if run.frozen is None else {k: v.clone() for k, v in run.frozen.model.state_dict().items()}
    )
    start = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.train()
    assert all(math.isfinite(loss) for loss in logged(run, "loss"))
    assert any(not torch.equal(start[k], v) for k, v in run.model.state_dict().items())
    if run.frozen is not None:
        assert all(p.grad is None and not p.requires_grad for p in run.frozen.model.parameters())
        for name, value in run.frozen.model.state_dict().items():
            assert torch.equal(value, frozen_before[name]), name
    expected = {"dive": "avl", "dive_avl": "avl", "dive_pvl": "pvl", "dive_cosine": "avl", "snd": "snd",
                "flyp_replay": "replay"}.get(objective)  # fmt: skip
    if expected:
        assert len(logged(run, expected)) == 3
    else:
        assert not logged(run, "avl") and run.extra_state() == {}


def test_the_first_step_sees_zero_differences(tmp_path):
    """Before any update the fine-tuned model is the pre-trained one: u = v = 0, AVL = PVL = 0 exactly."""
    run = trainer(tmp_path, settings(), steps=2)
    run.train()
    assert logged(run, "avl")[0] == 0.0 and logged(run, "pvl")[0] == 0.0
    assert logged(run, "avl")[1] > 0.0


def second_step(out_dir, **dive) -> tuple[dict, dict[str, torch.Tensor]]:
    """Step 2's log entry and gradient (float64, SGD). Step 1 sees u = v = 0, where AVL and PVL have zero
    gradient, so every objective and lambda starts step 2 from the same model and the same m."""
    from test_accumulation import GradientRecorder

    run = trainer(
        out_dir, settings(**dive), steps=2, dual_encoder=model().double(), optim="sgd", max_grad_norm=0.0
    )
    recorder = GradientRecorder()
    run.add_callback(recorder)
    run.train()
    return [h for h in run.state.log_history if "avl" in h or "loss" in h][1], recorder.steps[1]


def test_reference_term_is_lambda_weighted(tmp_path):
    """Eq. 9 at a step where AVL, PVL != 0: the loss is L_cl + lambda (AVL + PVL) and the gradient is linear
    in lambda (lambda**2 or a fixed weight would fail both)."""
    runs = {lam: second_step(tmp_path / str(lam), lambda_dive=lam) for lam in (0.0, 1.0, 3.0)}
    log, _ = runs[3.0]
    assert log["avl"] > 1e-6 and log["pvl"] > 1e-6
    assert log["loss"] == pytest.approx(runs[0.0][0]["loss"] + 3.0 * (log["avl"] + log["pvl"]), rel=1e-5)
    base = runs[0.0][1]
    for name, grad in runs[3.0][1].items():
        unit = runs[1.0][1][name] - base[name]
        torch.testing.assert_close(grad - base[name], 3.0 * unit, rtol=1e-5, atol=1e-5, msg=name)
    assert max(float((runs[1.0][1][n] - base[n]).abs().max()) for n in base) > 1e-4  # the term moved them


def test_each_ablation_switch_adds_only_its_own_term(tmp_path):
    """Table 5: dive_avl adds lambda AVL, dive_pvl lambda PVL, dive both, at the same step-2 model."""
    lam = 2.0
    runs = {
        o: second_step(tmp_path / o, objective=o, lambda_dive=lam)
        for o in ("flyp", "dive_avl", "dive_pvl", "dive")
    }
    cl = runs["flyp"][0]["loss"]
    avl, pvl = runs["dive"][0]["avl"], runs["dive"][0]["pvl"]
    assert abs(avl - pvl) > 1e-3 * max(avl, pvl)  # a swap of the two terms would show
    assert runs["dive_avl"][0]["loss"] == pytest.approx(cl + lam * avl, rel=1e-6)
    assert runs["dive_pvl"][0]["loss"] == pytest.approx(cl + lam * pvl, rel=1e-6)
    assert runs["dive"][0]["loss"] == pytest.approx(cl + lam * (avl + pvl), rel=1e-6)
    flyp = runs["flyp"][1]
    for name, grad in runs["dive"][1].items():
        parts = (runs["dive_avl"][1][name] - flyp[name]) + (runs["dive_pvl"][1][name] - flyp[name])
        torch.testing.assert_close(grad - flyp[name], parts, rtol=1e-5, atol=1e-5, msg=name)


def test_frozen_model_is_not_saved_and_the_export_is_a_plain_clip(tmp_path):
    run = trainer(tmp_path, settings(), steps=2, save_strategy="steps", save_steps=2)
    run.train()
    run.save_model(str(tmp_path / "final"))
    saved = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert set(saved) == set(model().state_dict())  # one model's weights, no frozen copy beside them
    checkpoint = tmp_path / "checkpoint-2"
    assert set(load_file(str(checkpoint / "model.safetensors"))) == set(saved)
    extra = load_file(str(checkpoint / EXTRA_STATE_NAME))
    assert set(extra) == {"avg_vector", "reference_batches", "pretrained_fingerprint"}
    assert int(extra["reference_batches"]) == 2


@pytest.mark.parametrize("frozen_embeddings", ["forward", "cache"])
def test_resume_is_exact(tmp_path, frozen_embeddings):
    """Killed after step 4 and resumed: the same weights and the same m as the uninterrupted 6 steps."""
    config = settings(frozen_embeddings=frozen_embeddings)
    checkpointing = dict(save_strategy="steps", save_steps=2, train_sampling_strategy="random")
    full = trainer(tmp_path / "full", config, steps=6, **checkpointing)
    full.train()
    resumed = trainer(tmp_path / "full", config, steps=6, **checkpointing)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"))
    assert resumed._reference.drawn == full._reference.drawn == 6
    torch.testing.assert_close(resumed.avg_vector, full.avg_vector, rtol=0, atol=0)
    assert_same_weights(full.model, resumed.model, rtol=0, atol=0)


def test_resume_without_the_restored_state_differs(tmp_path):
    """The check above can fail: restarting the reference stream and m from zero gives other weights."""
    config = settings()
    checkpointing = dict(save_strategy="steps", save_steps=2)
    full = trainer(tmp_path / "full", config, steps=6, **checkpointing)
    full.train()
    naive = trainer(tmp_path / "full", config, steps=6, **checkpointing)
    naive.load_extra_state = lambda state: None  # what a trainer without extra state would do
    naive.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"))
    assert not torch.equal(naive.avg_vector, full.avg_vector)


def test_resume_refuses_a_frozen_model_that_is_not_the_pretrained_one(tmp_path):
    config = settings()
    first = trainer(tmp_path, config, steps=2, save_strategy="steps", save_steps=2)
    first.train()
    wrong = trainer(tmp_path, config, steps=4, save_strategy="steps", save_steps=2)
    wrong.frozen.model.load_state_dict(first.model.state_dict())  # built from the fine-tuned weights
    wrong.frozen.fingerprint = type(wrong.frozen)(wrong.frozen.model).fingerprint
    with pytest.raises(UserError, match="pre-trained"):
        wrong.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


def test_separate_backward_gives_the_joint_gradient(tmp_path):
    """Back-propagating the reference term on its own (and under gradient accumulation) changes nothing."""
    runs = {}
    for separate in (True, False):
        runs[separate] = trainer(
            tmp_path / str(separate), settings(separate_backward=separate), steps=3, batch=2,
            gradient_accumulation_steps=2, **SGD,
        )  # fmt: skip
        runs[separate].train()
    assert logged(runs[True], "loss") == pytest.approx(logged(runs[False], "loss"), rel=1e-5)
    assert logged(runs[True], "grad_norm") == pytest.approx(logged(runs[False], "grad_norm"), rel=1e-4)
    assert_same_weights(runs[True].model, runs[False].model, rtol=1e-4, atol=1e-6)


def test_cache_gives_the_forward_embeddings(tmp_path):
    runs = {}
    for mode in ("forward", "cache"):
        runs[mode] = trainer(tmp_path / mode, settings(frozen_embeddings=mode), steps=8, batch=4, **SGD)
        runs[mode].train()
    assert runs["cache"].frozen.cached == 24  # 8 batches of 4 drew all 24 reference samples
    assert logged(runs["cache"], "avl") == pytest.approx(logged(runs["forward"], "avl"), rel=1e-5, abs=1e-9)
    assert_same_weights(runs["cache"].model, runs["forward"].model, rtol=1e-4, atol=1e-6)


def test_reduced_precision_frozen_model_is_not_exact(tmp_path):
    """A bfloat16 frozen model: u != 0 before any update (its rounding), which float32 does not have."""
    run = trainer(tmp_path, settings(frozen_dtype="bfloat16"), steps=1)
    run.train()
    assert run.frozen.model.dtype == torch.bfloat16 and run.model.dtype == torch.float32
    assert logged(run, "diff_norm")[0] > 1e-4


def test_evaluation_draws_no_reference_batch(tmp_path):
    run = trainer(tmp_path, settings(), steps=2, per_device_eval_batch_size=4)
    run.train()
    metrics = run.evaluate(rows(8, seed=5))
    assert math.isfinite(metrics["eval_loss"]) and run._reference.drawn == 2


def test_missing_reference_set_is_a_user_error(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", remove_unused_columns=False
    )
    with pytest.raises(UserError, match="reference_dataset"):
        DiVETrainer(
            model=model(), args=args, train_dataset=rows(4, 0), data_collator=collate, settings=settings()
        )


def test_cache_needs_a_map_style_reference_set(tmp_path):
    from datasets import IterableDataset

    stream = IterableDataset.from_generator(lambda: iter(rows(8, seed=2)))
    with pytest.raises(UserError, match="map-style"):
        trainer(tmp_path, settings(frozen_embeddings="cache"), steps=1, reference=stream)


def test_reference_stream_trains_and_resumes(tmp_path):
    """A shuffled stream of 10 rows in batches of 4 (2 per pass): resumed after step 1, across passes."""
    from datasets import IterableDataset

    data = rows(10, seed=2)

    def stream():
        return (
            IterableDataset.from_generator(lambda: iter(data))
            .shuffle(seed=0, buffer_size=10)
            .with_format("torch")
        )

    checkpointing = dict(save_strategy="steps", save_steps=1)
    full = trainer(tmp_path, settings(), steps=4, reference=stream(), **checkpointing)
    full.train()
    resumed = trainer(tmp_path, settings(), steps=4, reference=stream(), **checkpointing)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert_same_weights(full.model, resumed.model, rtol=0, atol=0)


# -- other dual encoders -----------------------------------------------------------------------------------


def test_siglip_trains_with_its_sigmoid_loss_unclamped(tmp_path):
    run = trainer(tmp_path, settings(), steps=2, learning_rate=1e-4, dual_encoder=tiny_siglip())
    assert run._siglip and run.max_logit_scale == math.inf
    batch = collate(rows(4, seed=1))
    with torch.no_grad():
        out = run.model(**{k: batch[k] for k in ("pixel_values", "input_ids", "attention_mask")})
        want = sigmoid_contrastive_loss(out.image_embeds, out.text_embeds, 117.0, -13.0, rank=0, world_size=1)
        run.model.eval()  # evaluation: L_cl alone
        torch.testing.assert_close(run.compute_loss(run.model, batch), want, rtol=1e-5, atol=1e-5)
    run.train()
    assert logged(run, "logit_scale")[0] == pytest.approx(117.0, rel=1e-4)  # not clamped to 100
    assert logged(run, "avl")[1] > 0


def test_diffclip_trains(tmp_path):
    run = trainer(tmp_path, settings(), steps=3, dual_encoder=tiny_diffclip())
    run.train()
    assert logged(run, "avl")[0] == 0.0 and logged(run, "avl")[2] > 0


@pytest.mark.parametrize("separate_backward", [True, False])
def test_siglip_replay_scores_the_reference_batch_with_its_own_bias(tmp_path, separate_backward):
    """FLYP + replay on SigLIP: the reference term is the sigmoid loss with the model's scale and bias, also
    when the reference batch is back-propagated on its own."""
    settings_ = settings(objective="flyp_replay", separate_backward=separate_backward)
    reference = rows(4, seed=2)  # one reference batch (B' = B = 4); the loss is the same in any order
    run = trainer(
        tmp_path, settings_, steps=1, learning_rate=0.0, dual_encoder=tiny_siglip(), reference=reference
    )
    run.train()
    batch = collate(reference)
    with torch.no_grad():
        out = run.model(**{k: batch[k] for k in ("pixel_values", "input_ids", "attention_mask")})
        want = sigmoid_contrastive_loss(out.image_embeds, out.text_embeds, 117.0, -13.0, rank=0, world_size=1)
    assert logged(run, "replay")[0] == pytest.approx(want.item(), rel=1e-4)
