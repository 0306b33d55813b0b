"""The description generator: the three-step dialogue, batched generation, resumable JSON output (a tiny
random LLaVA built from a config: its text is meaningless, the mechanics are real)."""

from __future__ import annotations

import json

import pytest
from clue_helpers import tiny_vlm, toy_data

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.describe import (
    DescriptionPrompts,
    conversation,
    dedupe_sentences,
    describe_batch,
    generate_descriptions,
    main,
)

PROMPTS = DescriptionPrompts(subject="shape", role="You are a geometer looking at {subject}s.", max_words=20)


@pytest.fixture(scope="module")
def vlm():
    return tiny_vlm()


def _keyed(n: int):
    return toy_data(n).add_column("key", [f"img{i:02d}" for i in range(n)])


def test_the_dialogue_has_a_role_and_three_steps():
    image = toy_data(1)[0]["image"]
    first = conversation(image, PROMPTS, [])
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[0]["content"][0]["text"] == "You are a geometer looking at shapes."
    assert first[1]["content"][0] == {"type": "image", "image": image}
    assert "global summary" in first[1]["content"][1]["text"]
    last = conversation(image, PROMPTS, ["summary", "parts"])
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last[2]["content"][0]["text"] == "summary" and "salient parts" in last[3]["content"][0]["text"]
    assert "at most 20 words" in last[5]["content"][0]["text"]
    assert sum(c["type"] == "image" for m in last for c in m["content"]) == 1


def test_dedupe_sentences():
    text = "A red star.  It has five points! a red star. It has five  points! Bright."
    assert dedupe_sentences(text) == "A red star. It has five points! Bright."


def test_batched_dialogue_runs_every_step(vlm, device):
    model, processor = vlm
    model.to(device)
    images = [row["image"] for row in toy_data(3)]
    answers = describe_batch(model, processor, images, PROMPTS, max_new_tokens=4)
    assert len(answers) == 3 and all(len(steps) == 3 for steps in answers)
    assert processor.tokenizer.padding_side == "right"  # restored after left-padded generation
    # greedy decoding with left padding: an image gets the same answers alone as in a batch
    alone = describe_batch(model, processor, images[1:2], PROMPTS, max_new_tokens=4)
    assert alone[0] == answers[1]
    model.to("cpu")


class Killed(Exception):
    pass


def test_writes_json_and_resumes_after_a_kill(vlm, tmp_path):
    model, processor = vlm
    data = _keyed(5)
    output = tmp_path / "descriptions.json"
    calls, kill_at = [], [4]  # the first step of the second batch, once
    generate = model.generate

    def dies_in_the_second_batch(**kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        if len(calls) == kill_at[0]:
            kill_at[0] = None
            raise Killed
        return generate(**kwargs)

    model.generate = dies_in_the_second_batch
    try:
        with pytest.raises(Killed):
            generate_descriptions(
                data, model, processor, output, prompts=PROMPTS, batch_size=2, max_new_tokens=4
            )
        first = json.loads(output.read_text())
        assert sorted(first) == ["img00", "img01"]  # the finished batch was written
        calls.clear()
        done = generate_descriptions(
            data, model, processor, output, prompts=PROMPTS, batch_size=2, max_new_tokens=4
        )
    finally:
        model.generate = generate
    assert calls == [2, 2, 2, 1, 1, 1]  # only the 3 images left, in batches of 2 and 1, 3 steps each
    assert sorted(done) == [f"img{i:02d}" for i in range(5)] and json.loads(output.read_text()) == done
    assert {k: done[k] for k in first} == first
    assert not list(tmp_path.glob("*.partial"))


def test_needs_an_id_column(vlm, tmp_path):
    model, processor = vlm
    with pytest.raises(UserError, match="'key' column"):
        generate_descriptions(toy_data(2), model, processor, tmp_path / "d.json")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="not a JSON object"):
        generate_descriptions(_keyed(2), model, processor, tmp_path / "bad.json")


def _write_cub(root, n: int = 4) -> None:
    """A minimal CUB-200-2011 layout: n images of two classes, all in the train split."""
    base = root / "CUB_200_2011"
    (base / "images" / "001.A").mkdir(parents=True)
    (base / "images" / "002.B").mkdir(parents=True)
    images = toy_data(n)
    paths = [f"{'001.A' if i % 2 == 0 else '002.B'}/img_{i}.png" for i in range(n)]
    for path, row in zip(paths, images):
        row["image"].save(base / "images" / path)
    (base / "images.txt").write_text("".join(f"{i + 1} {p}\n" for i, p in enumerate(paths)))
    (base / "classes.txt").write_text("1 001.A\n2 002.B\n")
    (base / "image_class_labels.txt").write_text("".join(f"{i + 1} {i % 2 + 1}\n" for i in range(n)))
    (base / "train_test_split.txt").write_text("".join(f"{i + 1} 1\n" for i in range(n)))


def test_command_line_on_cub(vlm, tmp_path, capsys):
    """`python -m hf_vrl.methods.clue.describe` on a saved VLM folder and a CUB layout (ids: CUB's keys)."""
    model, processor = vlm
    model.save_pretrained(tmp_path / "vlm")
    processor.save_pretrained(tmp_path / "vlm")
    _write_cub(tmp_path / "cub")
    output = tmp_path / "descriptions.json"
    argv = ["--model", str(tmp_path / "vlm"), "--dataset", f"cub:{tmp_path / 'cub'}", "--output", str(output)]
    assert (
        main(argv + ["--subject", "bird", "--batch-size", "3", "--max-new-tokens", "3", "--device", "cpu"])
        == 0
    )
    descriptions = json.loads(output.read_text())
    assert sorted(descriptions) == [
        "001.A/img_0.png",
        "001.A/img_2.png",
        "002.B/img_1.png",
        "002.B/img_3.png",
    ]
    assert "4 descriptions" in capsys.readouterr().out
