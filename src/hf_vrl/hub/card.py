"""The model card of a published run: metadata as the Hub expects it (`ModelCardData`, `model-index` from
`EvalResult`s) and the method's template in `model_cards/<method>.md`, filled from the run's `config.json`,
`report.json` and the published model's own `config.json`.

Templates are Jinja (huggingface_hub's `ModelCard.from_template`); what they receive is `_template_values`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_vrl.hub import markdown, record
from hf_vrl.hub.data_names import (
    DataName,
    describe_dataset,
    describe_mmvp,
    is_hub_id,
    is_local,
    public_path,
    without_paths,
)
from hf_vrl.hub.folder import ModelFolder
from hf_vrl.hub.methods import MODEL_CARDS, MethodCard, method_card
from hf_vrl.hub.results import data_table, eval_results, protocols, results_table
from hf_vrl.hub.usage import load_info

__all__ = ["BASE_MODEL_LICENSES", "DEFAULT_LICENSE", "build_model_card", "model_card"]

DEFAULT_LICENSE = "apache-2.0"  # hf_vrl's own; a model derived from a base checkpoint takes the base's
BASE_MODEL_LICENSES = {
    "openai/clip-": "mit",
    "facebook/metaclip-": "cc-by-nc-4.0",
    "google/siglip": "apache-2.0",
}
_OPTIMIZERS = {"adamw": "AdamW", "adamw_fused": "AdamW (fused)", "sgd": "SGD"}
_PRECISIONS = {
    "auto": "auto (bf16 where the GPU has it, else float32)",
    "no": "float32",
    "bf16": "bf16 mixed",
}
_LONG = 100  # settings whose value prints longer than this stay out of the settings table
MODEL_FOLDER_TEMPLATE = MODEL_CARDS / "model_folder.md"  # a model folder outside a run
_TITLES = {"diffclip": "DiffCLIP", "dcr": "DCR", "dive": "DiVE", "clue": "CLUE"}


def build_model_card(
    run_dir: str | Path,
    repo_id: str,
    *,
    what: str = "final",
    exports: Sequence[str] = (),
    license: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
) -> Any:
    """The `huggingface_hub.ModelCard` of the model `what` ("final" or an export) of the run in `run_dir`,
    published as `repo_id` with the `exports` in `exports/<name>/`. `license`, `base_model` and `datasets`
    replace what the card infers."""
    folder = ModelFolder.open(run_dir, what)
    return model_card(
        folder, repo_id, exports=exports, license=license, base_model=base_model, datasets=datasets
    )


# the Hub's inference widget of a CLIP-like model: an image and the labels to score it against
ZERO_SHOT_WIDGET = [
    {
        "src": "https://huggingface.co/datasets/mishig/sample_images/resolve/main/cat-dog-music.png",
        "candidate_labels": "a photo of a cat, a photo of a dog, a photo of a circle, a photo of a square",
        "example_title": "Cat and dog",
    }
]


def model_card(
    folder: ModelFolder,
    repo_id: str,
    *,
    exports: Sequence[str] = (),
    license: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
) -> Any:
    """The card of an opened `ModelFolder` (see `build_model_card`)."""
    from huggingface_hub import ModelCard, ModelCardData

    from hf_vrl.run.report import load_report

    if folder.run is None:
        return _model_folder_card(folder, repo_id, license=license, base_model=base_model, datasets=datasets)

    config = folder.run_config
    report = load_report(folder.run.root)
    method = method_card(folder.method)
    base = base_model or _base_model_id(config, method)
    train, evaluation, mmvp = _data(config, method)
    results = eval_results(report)
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=folder.pipeline_tag,
        tags=["hf_vrl", method.name, *method.tags] + (["custom_code"] if folder.remote_code else []),
        base_model=base,
        # `datasets` is the training data; what the model was scored on is in the model-index
        datasets=datasets or ([train.hub_id] if train and train.hub_id else None),
        license=license or _license(base),
        model_name=repo_id.split("/")[-1] if results else None,  # the model-index's name: with results only
        eval_results=results or None,
        widget=ZERO_SHOT_WIDGET if folder.pipeline_tag == "zero-shot-image-classification" else None,
    )
    values = _template_values(folder, repo_id, config, report, method, base, (train, evaluation, mmvp))
    values["contents"] = _contents(folder, repo_id, exports)
    return ModelCard.from_template(card_data, template_path=str(method.template), **values)


def _model_folder_card(
    folder: ModelFolder,
    repo_id: str,
    *,
    license: str | None,
    base_model: str | None,
    datasets: list[str] | None,
) -> Any:
    """The card of a model folder outside a run (`hf-vrl convert`, or an hf_vrl model saved by hand): what its
    `conversion.json` records, the loading lines, the method's citation; no results of its own."""
    from huggingface_hub import ModelCard, ModelCardData

    import hf_vrl

    method = method_card(folder.method)
    conversion = folder.conversion
    base = base_model or conversion.get("base_model")
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=folder.pipeline_tag,
        tags=["hf_vrl", method.name, *method.tags] + (["custom_code"] if folder.remote_code else []),
        base_model=base,
        datasets=datasets,
        license=license or _license(base),
        widget=ZERO_SHOT_WIDGET if folder.pipeline_tag == "zero-shot-image-classification" else None,
    )
    source = conversion.get("source") or {}
    origin = f"[`{base}`](https://huggingface.co/{base})" if base else None
    title, version = _TITLES.get(method.name, method.name), hf_vrl.__version__
    if source:
        where = origin or f"`{Path(str(source.get('checkpoint'))).name}`"
        intro = f"A **{title}** model converted by hf_vrl {version} from {where} ({source['kind']})."
    else:
        intro = f"A **{title}** model saved by hf_vrl {version} outside a training run."
    values = {
        "model_name": repo_id.split("/")[-1],
        "intro": intro,
        "load": load_info(folder, repo_id),
        "closeness": conversion.get("closeness"),
        "paper_results": conversion.get("paper_results"),
        "citation": _citation(method),
        **_folder_sections(source.get("kind")),
    }
    return ModelCard.from_template(card_data, template_path=str(MODEL_FOLDER_TEMPLATE), **values)


def _folder_sections(kind: str | None) -> dict[str, str]:
    """Uses, out of scope, limitations and training compute of a model folder outside a run, from what its
    `conversion.json` records (`kind`: how it was made)."""
    official = kind == "official checkpoint"
    uses = (
        "The authors' released DiffCLIP in transformers' format: zero-shot image classification, image-text "
        "retrieval and image or text features, as the released checkpoint."
        if official
        else "A starting point for DiffCLIP training (`hf-vrl train diffclip`): a CLIP with the differential "
        "branch added to each attention layer (how close it stays to its source is under Conversion, where "
        "measured); not a trained DiffCLIP."
        if kind
        else "An hf_vrl model saved outside a training run: what it was made for is not recorded here."
    )
    out_of_scope = [
        _HIGH_STAKES,
        "- Reporting numbers for this folder that were not measured on it: hf_vrl measured none here"
        + (" (the authors' figures below are theirs, on their checkpoint)." if official else "."),
    ]
    limitations = [
        "- No evaluation of this folder by hf_vrl: "
        + ("the conversion copies the weights key by key; the authors' figures are not re-measured here."
           if official else "the closeness to the source (above, where recorded) is all that was measured."
           if kind else "nothing was measured."),
        "- Made from its source as it was: what the source learnt from its data (and its biases) it keeps.",
    ]  # fmt: skip
    compute = (
        "None by hf_vrl: the weights were trained by the checkpoint's authors and converted here, no step "
        "of training."
        if official
        else "None by hf_vrl: the weights were converted from the source, no optimiser step (the new "
        "differential branch is set from a calibration pass, where recorded above)."
        if kind
        else "Not recorded: the folder was saved outside a training run."
    )
    return {
        "uses": uses,
        "out_of_scope": "\n".join(out_of_scope),
        "limitations": "\n".join(limitations),
        "compute": compute,
    }


def _citation(method: MethodCard) -> str:
    """The BibTeX block of the method's card template (its `## Citation` section)."""
    return method.template.read_text().split("## Citation", 1)[1].strip()


def _template_values(
    folder: ModelFolder,
    repo_id: str,
    config: dict[str, Any],
    report: dict[str, Any],
    method: MethodCard,
    base: str | None,
    data: tuple[DataName | None, ...],
) -> dict[str, Any]:
    """Everything a template reads besides the metadata."""
    import hf_vrl

    train, evaluation, mmvp = data
    return {
        "repo_id": repo_id,
        "model_name": repo_id.split("/")[-1],
        "what": folder.what,
        "load": load_info(folder, repo_id),
        "hf_vrl_version": hf_vrl.__version__,
        "config": config,
        "model_config": folder.config,
        "public": _public,
        "base_model_text": _base_model_text(config, method, base),
        "toy_world": _get(config, "data.dataset") == "shapes",
        "train_data": _train_data(report, train),
        "eval_data": record.data_text(record.eval_record(report, _get(config, "eval.eval_dataset"))),
        "mmvp_data": mmvp.name if mmvp else None,
        "pairs": record.pairs_text(report),
        "train": report.get("train") or {},
        "steps": record.stage_steps(report),
        "inputs": report.get("inputs") or {},
        "pretraining": record.pretraining_text(report),
        "labelled_inputs": record.labelled_inputs(report),
        "effect": lambda claim, *metrics: record.effect(report, claim, [m.split(".", 1) for m in metrics]),
        "training_table": _training_table(config, report),
        "settings_table": _settings_table(config, method),
        "results_table": results_table(report),
        "data_table": data_table(report),
        "protocols": _protocols_text(report),
        "compute_table": record.compute_table(report),
        "out_of_scope": _out_of_scope(config),
        "limitations": _limitations(config, report),
        "figures": [f"figures/{p.name}" for p in sorted(folder.run.figures.glob("*.png"))],
    }


def _contents(folder: ModelFolder, repo_id: str, exports: Sequence[str]) -> str:
    """What the repository holds besides the model: the exports (with their loading line) and the record."""
    lines = []
    for name in exports:
        export = ModelFolder.open(folder.run.root, name)
        line = load_info(export, repo_id, subfolder=f"exports/{name}").from_pretrained
        lines.append(f"- `exports/{name}/`: the run's `{name}` export, `{line.split(' = ', 1)[1]}`")
    shortened = without_paths(folder.run_config) != folder.run_config
    lines.append(
        f"- `run/config.json` and `run/report.json`: the run's settings and results; `hf-vrl train "
        f"{folder.method} --config run/config.json` repeats the run"
        + (" once its local paths (shortened to `…/<name>`) point to your copies" if shortened else "")
    )
    return "Also in this repository:\n\n" + "\n".join(lines)


# -- what the run used ---------------------------------------------------------------------------------------


def _get(config: Mapping[str, Any], path: str | None) -> Any:
    """`config["a"]["b"]` for "a.b" (None where absent, or for no path)."""
    if not path:
        return None
    value: Any = config
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _base_model_id(config: Mapping[str, Any], method: MethodCard) -> str | None:
    """The Hub id of the checkpoint the run started from (None: local, a preset, or from scratch)."""
    value = _get(config, method.base_model_setting)
    if isinstance(value, str) and is_hub_id(value) and not Path(value).exists():
        return value
    return None


def _license(base: str | None) -> str:
    for prefix, license in BASE_MODEL_LICENSES.items():
        if base and base.startswith(prefix):
            return license
    return DEFAULT_LICENSE


def _data(config: Mapping[str, Any], method: MethodCard) -> tuple[DataName | None, ...]:
    """(training data, evaluation data, MMVP pairs) as the card names them."""
    return (
        describe_dataset(_get(config, "data.dataset")),
        describe_dataset(_get(config, "eval.eval_dataset")),
        describe_mmvp(_get(config, method.mmvp_setting)),
    )


def _train_data(report: Mapping[str, Any], train: DataName | None) -> str | None:
    """The training data as the record has it (set, split, samples and how they were drawn); a run recorded
    before that is named without the samples."""
    recorded = record.data_text((report.get("train") or {}).get("data"))
    if recorded or train is None:
        return recorded
    return f"[{train.name}](https://huggingface.co/datasets/{train.hub_id})" if train.hub_id else train.name


def _base_model_text(config: Mapping[str, Any], method: MethodCard, base: str | None) -> str | None:
    """How the card names the starting checkpoint: a Hub link, a preset, or a local checkpoint."""
    if base:
        return f"[`{base}`](https://huggingface.co/{base})"
    value = _get(config, method.base_model_setting)
    if not isinstance(value, str):
        return None
    return f"a local checkpoint (`{Path(value).name}`)" if is_local(value) else f"hf_vrl's `{value}` preset"


# -- uses, limitations, compute ------------------------------------------------------------------------------

_HIGH_STAKES = (
    "- Decisions about people (identification, surveillance, profiling) or any other high-stakes use: the "
    "model carries the biases of its training data, and nothing here measured them."
)
TOY_DATA = frozenset({"shapes", "digits", "fashion_mnist", "animal_mnist"})  # hf_vrl's offline sets


def _toy(config: Mapping[str, Any]) -> bool:
    return _get(config, "data.dataset") in TOY_DATA


def _out_of_scope(config: Mapping[str, Any]) -> str:
    """The out-of-scope uses every card states (markdown bullets)."""
    lines = [
        _HIGH_STAKES,
        "- Reporting its evaluation as a benchmark result: those numbers are the training run's own checks, "
        "on the data listed with them.",
    ]
    if _toy(config):
        lines.insert(0, "- Anything but seeing the method run: the model was trained on toy data (below).")
    return "\n".join(lines)


def _limitations(config: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """The limitations every card states (markdown bullets): toy data, the run's budget."""
    train = report.get("train") or {}
    lines = []
    if _toy(config):
        data = describe_dataset(_get(config, "data.dataset"))
        lines.append(
            f"- Toy data: a miniature of the paper's experiment, trained on {data.name}, small "
            "low-resolution images hf_vrl ships for runs without downloads. It shows the method running end "
            "to end; it is not a useful encoder."
        )
    inputs = report.get("inputs") or {}
    before = ""
    if inputs:
        steps = sum(int(r.get("steps") or 0) for r in inputs.values())
        before = f", after {len(inputs)} in-run pre-training{'s' * (len(inputs) > 1)} of {steps} steps in all"
    lines.append(
        f"- Its training budget: {train.get('steps', '–')} optimiser steps in "
        f"{record.duration(train.get('runtime_s'))}{before} (Training compute above), far from a paper's; "
        "its numbers are this run's, not the paper's."
    )
    return "\n".join(lines)


# -- tables --------------------------------------------------------------------------------------------------


def _public(value: Any) -> str:
    """A setting as the card shows it: local paths shortened to their last part (they mean nothing on the
    Hub and may name the user's folders)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ", ".join(_public(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(", ", ": "))
    if isinstance(value, str):
        return public_path(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _protocols_text(report: Mapping[str, Any]) -> str:
    """How the report's tasks were scored: "clip_benchmark (zero-shot, retrieval); ... (mmvp)"."""
    grouped: dict[str, list[str]] = {}
    for section, protocol in protocols(report).items():
        grouped.setdefault(protocol, []).append(section.replace("_", "-"))
    return "; ".join(f"{protocol} ({', '.join(sections)})" for protocol, sections in grouped.items())


def _steps(report: Mapping[str, Any]) -> str:
    train = report.get("train") or {}
    stages = train.get("stages") or {}
    total = str(train.get("steps", "–"))
    if len(stages) > 1:
        total += " (" + ", ".join(f"{name}: {stage.get('steps')}" for name, stage in stages.items()) + ")"
    return total


def _optimizer(optim: Mapping[str, Any]) -> str:
    name = _OPTIMIZERS.get(optim.get("optimizer"), str(optim.get("optimizer")))
    if optim.get("optimizer") == "sgd":
        return f"{name}, momentum {_public(optim.get('sgd_momentum'))}"
    betas = f"β = ({_public(optim.get('adam_beta1'))}, {_public(optim.get('adam_beta2'))})"
    return f"{name}, {betas}, ε = {_public(optim.get('adam_epsilon'))}"


def _schedule(optim: Mapping[str, Any]) -> str:
    text = f"{_public(optim.get('learning_rate'))} peak, {optim.get('lr_scheduler')}"
    if optim.get("min_learning_rate"):
        text += f" to {_public(optim['min_learning_rate'])}"
    if optim.get("warmup_steps"):
        text += f", {optim['warmup_steps']} warm-up steps"
    elif optim.get("warmup_ratio"):
        text += f", warm-up over {100 * optim['warmup_ratio']:g} % of the run"
    return text


def _batch(optim: Mapping[str, Any]) -> str:
    text = f"micro-batches of up to {optim.get('batch_size')} per device"
    if optim.get("global_batch_size"):
        text += f", {optim['global_batch_size']} per optimiser step"
    elif optim.get("gradient_accumulation_steps"):
        text += f" × {optim['gradient_accumulation_steps']} accumulation steps"
    if optim.get("accumulation") == "micro_batch":
        return text + " (each micro-batch's loss over its own samples)"
    return text + " (the loss over the whole step's batch)" if optim.get("accumulation") else text


def _training_table(config: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """The shared optimisation settings and what the run measured."""
    optim = config.get("optim") or {}
    train = report.get("train") or {}
    rows = [
        ("optimiser steps", _steps(report)),
        ("batch", _batch(optim)),
        ("optimiser", _optimizer(optim)),
        ("weight decay", _public(optim.get("weight_decay"))),
        ("learning rate", _schedule(optim)),
        (
            "gradient clipping",
            f"max norm {_public(optim['max_grad_norm'])}" if optim.get("max_grad_norm") else "none",
        ),
        ("precision", _PRECISIONS.get(config.get("precision"), f"{config.get('precision')} mixed")),
        ("seed", config.get("seed")),
        *_step_limit(optim),
        ("training time", f"{train.get('runtime_s', 0):g} s ({train.get('samples_per_s', 0):g} samples/s)"),
    ]
    return markdown.table(["setting", "value"], rows)


def _step_limit(optim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The row of a run under `--step-limit`: its configured step counts (the settings below) did not run."""
    limit = optim.get("step_limit")
    if limit is None:
        return []
    text = (
        f"--step-limit {limit}: every training loop (stages and in-run pre-trainings) ran at most {limit} "
        "steps; the step counts among the settings are as configured, not as run"
    )
    return [("step limit", text)]


def _settings_table(config: Mapping[str, Any], method: MethodCard) -> str:
    """The method's own section and its model section, as recorded (long values, e.g. the architecture,
    are described from the model's config instead)."""
    rows = []
    for section in ("model", method.name):
        for key, value in (config.get(section) or {}).items():
            shown = _public(value)
            if len(shown) <= _LONG:
                rows.append((f"`{section}.{key}`", shown))
    return markdown.table(["setting", "value"], rows)
