"""The memory one GPU process of a run asks for, and the budget each paper preset must fit.

Budgets (issue 36): every DCR preset at its batch of 16 within 40 GiB, so that one 48 GB card (A6000, L40S)
trains any of them (the DCR paper's Table 8 needs 53-79 GB of an A100 80 GB); DiffCLIP, DiVE and CLUE within
the 80 GB GPU their papers trained on, at their micro-batch.

DCR is predicted from its parts at the real size (`hf_vrl.methods.dcr.footprint`: seconds, no weights, the
preset's memory settings); the other methods by the dry run's fit through the micro-batches it measured
(`hf_vrl.run.dry_run.predict_memory`). Both are bytes the CUDA allocator is asked for, without its caching
slack or the CUDA context (about 0.5 GB).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DCR_BUDGET",
    "GPU_BUDGET",
    "MEMORY_SETTINGS",
    "budget",
    "component_prediction",
    "has_components",
    "memory_settings",
    "prediction_lines",
    "validate",
    "with_budget",
]

GIB = 2**30
DCR_BUDGET = 40 * GIB  # DCR at its batch of 16: one 48 GB card
GPU_BUDGET = 80e9  # DiffCLIP, DiVE, CLUE at their micro-batch: the 80 GB GPU of their papers
# the settings that change a step's memory and nothing it computes (with the precision the run measured in)
MEMORY_SETTINGS = {
    "dcr": (
        "dcr.encoder_gradient_checkpointing",
        "dcr.gradient_checkpointing",
        "dcr.unet_chunk_size",
        "dcr.lean_activations",
        "dcr.reuse_prefix",
        "dcr.unet_autocast",
        "dcr.diffusion_dtype",
        "precision",
    )
}


def budget(config: Any) -> float:
    """Bytes one process of `config`'s method may ask for."""
    return DCR_BUDGET if config.method == "dcr" else GPU_BUDGET


def has_components(config: Any) -> bool:
    """Whether `config`'s memory is predicted from its parts (DCR with models hf_vrl knows the size of)."""
    from hf_vrl.run.real_models import catalogue

    known = catalogue()
    return config.method == "dcr" and config.model.clip in known and config.dcr.diffusion in known


def memory_settings(config: Any) -> dict[str, Any]:
    """{dotted path: value} of `config`'s memory-only settings."""
    flat = config.flat_settings()
    return {path: flat[path] for path in MEMORY_SETTINGS.get(config.method, ())}


def component_prediction(config: Any, stages: list[str], micro_batch: int | None = None) -> dict[str, Any]:
    """The DCR footprint of every stage at `micro_batch` (default the configuration's own), its peak, the
    budget and whether it fits."""
    from hf_vrl.methods.dcr.footprint import predict_step

    batch = micro_batch or config.batch_plan(1).micro_batch
    steps = {stage: predict_step(config, stage, batch).report() for stage in stages}
    peak = max(step["peak"] for step in steps.values())
    return {
        "micro_batch": batch,
        "stages": steps,
        "predicted_gib": peak,
        "budget_gib": round(budget(config) / GIB, 2),
        "within_budget": peak * GIB <= budget(config),
        "memory_settings": memory_settings(config),
        "how": "hf_vrl.methods.dcr.footprint: weights + gradients + AdamW state + max(tower + UNet passes x "
        "kept + chunk x transient + data, AdamW state), each part measured on fake tensors at the real size",
    }


def validate(
    config: Any, stages: list[str], records: list[Mapping[str, Any]], micro_batch: int
) -> dict[str, Any]:
    """The footprint's activations at `micro_batch` beside those a run of `config` at that micro-batch
    measured (its step records: the most a step held above what stays allocated, less the gradients and
    the batch), and what stays allocated with the gradients (weights, AdamW state), per stage."""
    from hf_vrl.methods.dcr.footprint import predict_step

    found = {}
    for stage in stages:
        mine = [r for r in records if r["stage"] == stage and r["rank"] == 0]
        if not mine:
            continue
        batch = micro_batch
        measured = max(r["step_peak_bytes"] - r["grad_bytes"] - r["data_bytes"] for r in mine)
        step = predict_step(config, stage, batch)
        last = mine[-1]
        static = last["static_bytes"] + last["grad_bytes"]
        if last["step"] == 1:  # the optimiser state is made inside the first step: its optimiser peak
            static += last["optimizer_peak_bytes"]
        found[stage] = {
            "micro_batch": batch,
            "measured_activations_gib": round(measured / GIB, 4),
            "predicted_activations_gib": round(step.activations / GIB, 4),
            "relative_error": round(step.activations / measured - 1, 4),
            "measured_static_gib": round(static / GIB, 4),
            "predicted_static_gib": round((step.weights + step.gradients + step.optimizer_state) / GIB, 4),
        }
    return found


def with_budget(prediction: dict[str, Any], config: Any) -> dict[str, Any]:
    """`prediction` (the dry run's fit) with the budget of `config` and whether it fits."""
    peak = prediction.get("predicted_gib")
    limit = budget(config)
    return prediction | {
        "budget_gib": round(limit / GIB, 2),
        "within_budget": peak is not None and peak * GIB <= limit,
    }


def prediction_lines(prediction: Mapping[str, Any] | None) -> list[str]:
    """What --print-config and the dry run's summary say of a prediction."""
    if not prediction or prediction.get("predicted_gib") is None:
        return []
    peak, batch = prediction["predicted_gib"], prediction["micro_batch"]
    line = f"predicted on a GPU at micro-batch {batch}: {peak:.1f} GiB allocated per process"
    if "budget_gib" in prediction:
        verdict = "within" if prediction["within_budget"] else "ABOVE"
        line += f", {verdict} the {prediction['budget_gib']:g} GiB budget"
    settings = prediction.get("memory_settings")
    lines = [line]
    if settings:
        lines.append("  with " + ", ".join(f"{path} {value}" for path, value in settings.items()))
    return lines
