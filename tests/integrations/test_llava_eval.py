"""`hf-vrl llava-eval`: lmms-eval's `llava_hf` backend scores a LLaVA that `hf-vrl export-llava` wrote on a
local yes/no task (a parquet of generated images, a task YAML with its utils.py), offline on CPU, and its
accuracy and per-sample answers equal a hand count with plain transformers; without lmms-eval the command says
in one line how to install it. Its builders (yes_no_rows, yes_no_llava, hand_count, local_task) also serve
the reproduce scripts' LLaVA-table tests (tests/methods/reproduce_helpers.py: llava_eval_builders)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

import pytest
import torch
from llava_helpers import IMAGE_SIZE, tiny_llava, tiny_processor, toy_tokenizer
from PIL import Image
from transformers import AutoProcessor, CLIPImageProcessorPil, LlavaForConditionalGeneration

from hf_vrl.cli import main as cli_main
from hf_vrl.errors import UserError
from hf_vrl.integrations import llava_eval
from hf_vrl.integrations.llava_export import main as export_main
from hf_vrl.methods.dcr.export import export_vision_tower
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel

TASK = "hfvrl_toy_yesno"
POST_PROMPT = "\nAnswer the question using a single word or phrase."
# llava-hf/llava-1.5's processor template: "USER: <image>\n{text} ASSISTANT:"
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}"
    "{% endif %}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' ' }}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
ANSWERS = ["yes", "yes", "yes", "no", "no", "no"]
# What the tiny LLaVA is made to answer (its head is solved for it below): 4 of 6 right.
MODEL_SAYS = ["yes", "yes", "no", "no", "no", "yes"]

TASK_YAML = """\
task: {task}
dataset_path: parquet
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_visual: !function utils.doc_to_visual
doc_to_text: !function utils.doc_to_text
doc_to_target: answer
generation_kwargs:
  max_new_tokens: 1
  temperature: 0
  do_sample: false
process_results: !function utils.process_results
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
lmms_eval_specific_kwargs:
  default:
    pre_prompt: ""
    post_prompt: "\\nAnswer the question using a single word or phrase."
metadata:
  version: 0.0
"""

TASK_UTILS = """\
def doc_to_visual(doc):
    return [doc["image"].convert("RGB")]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kwargs = lmms_eval_specific_kwargs or {}
    return f"{kwargs.get('pre_prompt', '')}{doc['question'].strip()}{kwargs.get('post_prompt', '')}"


def process_results(doc, results):
    prediction = results[0].strip().lower().rstrip(".")
    return {"exact_match": 1.0 if prediction == doc["answer"] else 0.0}
"""


def yes_no_rows() -> list[dict]:
    """Six 32 px images of a coloured square; the question names its colour (yes) or another one (no)."""
    names = list(COLORS)
    rows = []
    for i, answer in enumerate(ANSWERS):
        name = names[i % 3]
        image = Image.new("RGB", (32, 32), (255, 255, 255))
        image.paste(COLORS[name], (4 + i, 4 + i, 24 + i, 24))
        asked = name if answer == "yes" else names[(i + 1) % 3]
        rows.append(
            dict(
                question_id=i, image=image, question=f"Is there a {asked} square in the image?", answer=answer
            )
        )
    return rows


def _prompt_inputs(processor, row) -> dict:
    """The prompt lmms-eval's chat path builds: the processor's template over [image, question + prompt]."""
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": row["question"] + POST_PROMPT}],
        }
    ]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return processor(images=[row["image"]], text=text, return_tensors="pt")


def _export(base, tower, out):
    assert export_main(["--llava", str(base), "--vision", str(tower), "--output", str(out)]) == 0
    return out


def yes_no_llava(tmp_path, rows):
    """A tiny LLaVA exported by `hf-vrl export-llava` (a DCR tower swapped in) whose head scores only `yes`
    and `no`: their rows are +w and -w, w solved so that the exported model answers MODEL_SAYS on ROWS."""
    tokenizer = toy_tokenizer()
    tokenizer.add_tokens(["yes", "no"])
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
    llava = tiny_llava(tokenizer)
    processor = tiny_processor(tokenizer)
    processor.chat_template = CHAT_TEMPLATE
    dcr = DCRModel.from_clip(
        tiny_clip(image_size=IMAGE_SIZE, seed=1), condition_dim=16, num_condition_tokens=5
    )
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    tower = export_vision_tower(dcr, tmp_path / "tower", image_processor=image_processor)

    llava.save_pretrained(tmp_path / "base")
    processor.save_pretrained(tmp_path / "base")
    probe = LlavaForConditionalGeneration.from_pretrained(
        _export(tmp_path / "base", tower, tmp_path / "probe")
    )
    probe_processor = AutoProcessor.from_pretrained(tmp_path / "probe")
    states = []
    hook = probe.lm_head.register_forward_hook(lambda module, inputs, output: states.append(inputs[0][0, -1]))
    with torch.no_grad():
        for row in rows:
            probe(**_prompt_inputs(probe_processor, row))
    hook.remove()
    signs = torch.tensor([1.0 if said == "yes" else -1.0 for said in MODEL_SAYS])
    w = torch.linalg.lstsq(torch.stack(states).double(), signs.double()[:, None]).solution[:, 0].float()

    with torch.no_grad():
        llava.lm_head.weight.zero_()
        llava.lm_head.weight[yes] = w
        llava.lm_head.weight[no] = -w
    llava.save_pretrained(tmp_path / "base")
    return _export(tmp_path / "base", tower, tmp_path / "llava")


def hand_count(model_dir, rows) -> list[str]:
    """Each row's answer from plain transformers: greedy, one new token, as the task's generation_kwargs."""
    model = LlavaForConditionalGeneration.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    answers = []
    for row in rows:
        inputs = _prompt_inputs(processor, row)
        output = model.generate(**inputs, max_new_tokens=1, do_sample=False)
        new = output[0, inputs["input_ids"].shape[1] :]
        answers.append(processor.tokenizer.decode(new, skip_special_tokens=True).strip().lower())
    return answers


def local_task(folder, rows):
    import datasets

    features = datasets.Features(
        question_id=datasets.Value("int64"),
        image=datasets.Image(),
        question=datasets.Value("string"),
        answer=datasets.Value("string"),
    )
    folder.mkdir()
    data = folder / "data.parquet"
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(data))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data))
    (folder / "utils.py").write_text(TASK_UTILS)
    return folder


def test_lmms_eval_scores_an_exported_llava_on_a_local_task_as_a_hand_count_does(
    tmp_path, monkeypatch, capsys
):
    pytest.importorskip("lmms_eval", reason="lmms-eval is not installed (pip install 'hf-vrl[llava-eval]')")
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache"),
    }.items():
        monkeypatch.setenv(name, value)
    rows = yes_no_rows()
    model_dir = yes_no_llava(tmp_path, rows)
    hand = hand_count(model_dir, rows)
    assert hand == MODEL_SAYS
    hand_accuracy = sum(said == answer for said, answer in zip(hand, ANSWERS)) / len(rows)
    assert hand_accuracy == pytest.approx(4 / 6)
    tasks = local_task(tmp_path / "tasks", [{**row} for row in rows])

    out = tmp_path / "eval"
    argv = ["llava-eval", str(model_dir), "--tasks", TASK, "--include-path", str(tasks), "--device", "cpu"]
    assert cli_main([*argv, "--output-dir", str(out)]) == 0

    report = json.loads((out / llava_eval.RESULTS_FILE).read_text())
    assert report["tasks"][TASK]["exact_match"] == pytest.approx(hand_accuracy)
    assert report["samples"] == {TASK: len(rows)}
    assert report["empty_answers"] == {TASK: 0}
    results_path = out / report["lmms_eval_results"]
    (samples_path,) = results_path.parent.glob(
        f"{results_path.name.removesuffix('_results.json')}_samples_{TASK}.jsonl"
    )
    samples = [json.loads(line) for line in samples_path.read_text().splitlines()]
    answered = {sample["doc_id"]: sample["filtered_resps"] for sample in samples}
    assert [str(answered[i]).strip().lower() for i in range(len(rows))] == hand
    table = capsys.readouterr().out
    assert f"{TASK}  exact_match  {hand_accuracy:.4f}" in table


def test_without_lmms_eval_the_command_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lmms_eval", None)  # import lmms_eval fails: as if not installed
    argv = [str(tmp_path / "llava"), "--tasks", "pope", "--output-dir", str(tmp_path / "out")]
    with pytest.raises(UserError, match=r"^lmms-eval is not installed: pip install 'hf-vrl\[llava-eval\]'$"):
        llava_eval.main(argv)
    assert cli_main(["llava-eval", *argv]) == 2
    error = capsys.readouterr().err
    assert "hf-vrl: error: lmms-eval is not installed: pip install 'hf-vrl[llava-eval]'" in error
    assert not (tmp_path / "out").exists()


def test_the_lmms_eval_command_passes_device_map_limit_and_the_task_folder(tmp_path):
    """transformers 5 refuses lmms-eval's default device_map=""; a processor without a chat template takes
    lmms-eval's simple path (Vicuna prompt)."""
    (tmp_path / "llava").mkdir()
    (tmp_path / "tasks").mkdir()
    options = argparse.Namespace(
        model=str(tmp_path / "llava"),
        device="cpu",
        dtype="auto",
        model_args="attn_implementation=eager",
        tasks="pope,mmvp",
        include_path=str(tmp_path / "tasks"),
        limit=5,
    )
    command = llava_eval.lmms_eval_command(options, tmp_path / "out")
    assert command[:2] == [sys.executable, "-c"]
    flags, arguments = {}, command[3:]
    for i, argument in enumerate(arguments):
        if argument.startswith("--"):
            value = arguments[i + 1] if i + 1 < len(arguments) else None
            flags[argument] = None if value is None or value.startswith("--") else value
    assert flags["--model"] == "llava_hf"
    assert flags["--model_args"] == (
        f"pretrained={tmp_path / 'llava'},device=cpu,device_map=cpu,dtype=auto,attn_implementation=eager"
    )
    assert (flags["--tasks"], flags["--limit"], flags["--batch_size"]) == ("pope,mmvp", "5", "1")
    assert flags["--include_path"] == str(tmp_path / "tasks")
    assert "--log_samples" in flags and flags["--force_simple"] is None
    (tmp_path / "llava" / "chat_template.jinja").write_text(textwrap.dedent(CHAT_TEMPLATE))
    assert "--force_simple" not in llava_eval.lmms_eval_command(options, tmp_path / "out")
