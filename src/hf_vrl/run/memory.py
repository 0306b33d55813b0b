"""The memory one GPU process of a run asks for, and the budget each paper preset must fit.

Budgets (issue 36): every DCR preset at its batch of 16 within 40 GiB, so that one 48 GB card (A6000, L40S)
trains any of them (the DCR paper's Table 8 needs 53-79 GB of an A100 80 GB); DiffCLIP, DiVE and CLUE within
the 80 GB GPU their papers trained on, at their micro-batch.

DCR is predicted from its parts at the real size (`hf_vrl.methods.dcr.footprint`: seconds, no weights, the
preset's memory settings); the other methods by the dry run's fit through the micro-batches it measured
(`hf_vrl.run.dry_run.predict_memory`). Both are bytes the CUDA allocator is asked for, without its caching
slack or the CUDA context (about 0.5 GB).

`memory_predictions.json` (beside this module, shipped in the wheel) holds every paper preset's prediction at
its own settings: the dry runs' fits as coefficients (linear in the micro-batch), DCR's footprint per stage.
`benchmarks/dry_runs.py --recompute` writes it from `benchmarks/results/dry_runs.json`; --print-config and the
README's table read it. None of it has been measured on a GPU yet.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "DCR_BUDGET",
    "GPU_BUDGET",
    "MEMORY_SETTINGS",
    "budget",
    "chosen_settings",
    "component_prediction",
    "fit_at",
    "fitted_settings",
    "has_components",
    "memory_settings",
    "memory_table",
    "packaged_predictions",
    "prediction_lines",
    "preset_prediction",
    "real_models",
    "validate",
    "with_budget",
]

GIB = 2**30
PREDICTIONS = Path(__file__).with_name("memory_predictions.json")
NOT_MEASURED = "predicted, not yet measured on a GPU"
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
    ),
    "diffclip": ("precision",),
    "dive": ("dive.frozen_dtype", "precision"),
    "clue": ("precision",),
}
# what else a packaged prediction holds for: the shapes its dry runs measured (and real_models' models)
SHAPE_SETTINGS = {
    "diffclip": ("model.architecture",),
    "dive": ("model.image_size",),
    "clue": ("clue.image_size",),
    "dcr": (),
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


def real_models(config: Any) -> dict[str, str]:
    """{setting: Hub id} of the settings naming a model hf_vrl has a real-size configuration of."""
    from hf_vrl.run.real_models import catalogue

    known = catalogue()
    return {
        path: value
        for path, value in config.flat_settings().items()
        if isinstance(value, str) and value in known
    }


def fitted_settings(config: Any) -> dict[str, Any]:
    """What a packaged prediction holds for: the memory settings, the shapes and the models (the
    micro-batch apart)."""
    flat = config.flat_settings()
    shapes = {path: flat[path] for path in SHAPE_SETTINGS.get(config.method, ())}
    return memory_settings(config) | shapes | real_models(config)


def chosen_settings(config: Any) -> dict[str, Any]:
    """`config`'s memory settings that differ from its method's defaults, and its precision."""
    defaults = memory_settings(type(config)())
    mine = memory_settings(config)
    return {path: value for path, value in mine.items() if path == "precision" or defaults[path] != value}


@cache
def packaged_predictions() -> dict[str, Any]:
    """`memory_predictions.json`: {preset: its prediction at its own settings} (the module docstring)."""
    return json.loads(PREDICTIONS.read_text())["presets"]


def fit_at(stages: Mapping[str, Any], micro_batch: int) -> dict[str, Any]:
    """A dry run's fit (per stage: what stays allocated, the gradients, the optimiser step's peak, the data
    per sample and the activations' polynomial in the micro-batch) at `micro_batch`, in GiB."""
    found = {}
    for stage, fit in stages.items():
        activations = 0.0
        for coefficient in fit["activations_polynomial"]:  # highest power first, as numpy.polyfit
            activations = activations * micro_batch + coefficient
        data = fit["data_bytes_per_sample"] * micro_batch
        peak = (
            fit["static_bytes"] + fit["gradient_bytes"] + max(activations + data, fit["optimizer_step_bytes"])
        )
        found[stage] = {"activations_gib": round(activations / GIB, 4), "predicted_gib": round(peak / GIB, 4)}
    return found


def preset_prediction(
    config: Any, preset: str | None, stages: list[str] | None = None
) -> dict[str, Any] | None:
    """The memory `config` (from `preset`, when it came from one) asks of one GPU process at its micro-batch:
    the packaged prediction where `config` has the preset's settings (a fit evaluated at another micro-batch);
    DCR's footprint for any other DCR settings (`stages`: default both); else the preset's own prediction,
    marked `for_the_presets_settings`. None where nothing predicts it (--dry-run does)."""
    entry = packaged_predictions().get(preset or "")
    batch = config.batch_plan(1).micro_batch
    same = entry is not None and entry["settings"] == _json(fitted_settings(config))
    if same and batch == entry["micro_batch"]:
        return _entry_prediction(entry)
    if same and entry["how"] == "fit":
        at = fit_at(entry["stages"], batch)
        found = {
            "micro_batch": batch,
            "fitted_micro_batch": entry["micro_batch"],
            "predicted_gib": max(stage["predicted_gib"] for stage in at.values()),
            "stages": at,
            "how": entry["how"],
            "memory_settings": memory_settings(config),
        }
        return with_budget(found, config)
    if has_components(config):
        return component_prediction(config, stages or ["stage1", "stage2"])
    if entry is not None:
        return _entry_prediction(entry) | {"for_the_presets_settings": _differences(entry, config)}
    return None


def _entry_prediction(entry: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("micro_batch", "predicted_gib", "budget_gib", "within_budget", "stages", "how", "memory_settings")
    return {key: entry[key] for key in keys}


def _differences(entry: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """{setting: this configuration's value} where it differs from what `entry` was predicted for."""
    mine = _json(fitted_settings(config)) | {"micro_batch": config.batch_plan(1).micro_batch}
    theirs = entry["settings"] | {"micro_batch": entry["micro_batch"]}
    return {key: value for key, value in mine.items() if theirs.get(key) != value}


def _json(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples as lists)."""
    return json.loads(json.dumps(value))


def memory_table(predictions: Mapping[str, Any] | None = None) -> str:
    """The README's table of every paper preset's prediction (default: the packaged ones)."""
    rows = [
        "| preset | batch / micro-batch | settings (beside the defaults) | predicted peak per GPU process "
        "| budget | on a GPU |",
        "|---|---|---|---|---|---|",
    ]
    for preset, entry in sorted((predictions or packaged_predictions()).items()):
        settings = ", ".join(f"`{path.split('.')[-1]}` {value}" for path, value in entry["chosen"].items())
        rows.append(
            f"| {preset} | {entry['global_batch']} / {entry['micro_batch']} | {settings} | "
            f"{entry['predicted_gib']:.1f} GiB | {round(entry['budget_gib'], 1):g} GiB | {NOT_MEASURED} |"
        )
    return "\n".join(rows)


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
    line += f" ({NOT_MEASURED})"  # at the preset's batch: the GPU check will measure it
    settings = prediction.get("memory_settings")
    lines = [line]
    if settings:
        lines.append("  with " + ", ".join(f"{path} {value}" for path, value in settings.items()))
    if "fitted_micro_batch" in prediction:
        lines.append(
            f"  the dry runs' fit (linear in the micro-batch) evaluated at {batch}; the preset's own is "
            f"{prediction['fitted_micro_batch']}"
        )
    if prediction.get("for_the_presets_settings"):
        changed = ", ".join(f"{key} {value}" for key, value in prediction["for_the_presets_settings"].items())
        lines.append(
            f"  this is the prediction for the preset's own settings, not for this configuration's {changed}"
            ": --dry-run measures it"
        )
    return lines
