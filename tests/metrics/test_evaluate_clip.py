"""evaluate_clip and `hf-vrl eval` end to end on tiny random models (CLIP, SigLIP, a vision tower) and inline
datasets."""

import copy
import json
import logging
import re
import string

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    CLIPConfig,
    CLIPImageProcessor,
    CLIPModel,
    CLIPProcessor,
    CLIPTokenizer,
    CLIPVisionConfig,
    CLIPVisionModel,
    SiglipConfig,
    SiglipModel,
)

from hf_vrl import eval_command, eval_inputs, evaluation
from hf_vrl.data.prompts import OPENAI_TEMPLATES, ZERO_SHOT_TEMPLATES
from hf_vrl.errors import UserError
from hf_vrl.metrics import clustering_scores, mmvp_score, zero_shot_accuracy, zero_shot_classifier

COLORS = {"red": (200, 30, 30), "green": (30, 180, 40), "blue": (30, 40, 210)}
TEMPLATES = ("a photo of a {} square.", "a {} thing.")
PNG = b"\x89PNG\r\n\x1a\n"


def char_tokenizer():
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase + string.digits + ".,'-!":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[])


TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
VISION = dict(TOWER, image_size=16, patch_size=8)


def tiny_clip_config(vocab_size):
    text = dict(TOWER, vocab_size=vocab_size, max_position_embeddings=48, bos_token_id=0, eos_token_id=1)
    return CLIPConfig(text_config=dict(text, pad_token_id=1), vision_config=VISION, projection_dim=16)


def tiny_clip(seed=0):
    torch.manual_seed(seed)
    return CLIPModel(tiny_clip_config(len(char_tokenizer()))).eval()


def image_processor():
    return CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})


def color_image(rgb, rng, size=16):
    noise = rng.integers(-25, 25, size=(size, size, 3))
    return Image.fromarray(np.clip(np.array(rgb) + noise, 0, 255).astype(np.uint8))


def color_dataset(n_per_class=4, seed=0):
    """3 coarse colours x 2 fine shades each; captions repeat within a fine class."""
    rng = np.random.default_rng(seed)
    rows = {"image": [], "caption": [], "label": [], "fine_label": []}
    for label, (name, rgb) in enumerate(COLORS.items()):
        for i in range(n_per_class):
            shade = i % 2
            rows["image"].append(color_image(np.array(rgb) * (0.6 if shade else 1.0), rng))
            rows["caption"].append(f"a {'dark ' if shade else ''}{name} square")
            rows["label"].append(label)
            rows["fine_label"].append(2 * label + shade)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "caption": datasets.Value("string"),
            "label": datasets.ClassLabel(names=list(COLORS)),
            "fine_label": datasets.Value("int64"),
        }
    )
    return datasets.Dataset.from_dict(rows, features=features)


def pairs_dataset(seed=0):
    rng = np.random.default_rng(seed)
    rows = {"image_a": [], "image_b": [], "statement_a": [], "statement_b": [], "category": []}
    for (a, b), category in [
        (("red", "blue"), "colour"),
        (("green", "red"), "colour"),
        (("blue", "green"), "hue"),
    ]:
        rows["image_a"].append(color_image(COLORS[a], rng))
        rows["image_b"].append(color_image(COLORS[b], rng))
        rows["statement_a"].append(f"a {a} square")
        rows["statement_b"].append(f"a {b} square")
        rows["category"].append(category)
    return datasets.Dataset.from_dict(rows)


@pytest.fixture(scope="module")
def clip():
    return tiny_clip(0), image_processor(), char_tokenizer()


def test_evaluate_clip_runs_every_task_and_is_json(clip):
    model, proc, tok = clip
    test, train = color_dataset(4, seed=0), color_dataset(6, seed=1)
    report = evaluation.evaluate_clip(
        model,
        proc,
        tok,
        test,
        tasks=evaluation.TASKS,
        train_dataset=train,
        mmvp=pairs_dataset(),
        reference_model=copy.deepcopy(model),
        templates=TEMPLATES,
        batch_size=5,
        seed=0,
    )
    assert json.loads(json.dumps(report, allow_nan=False)) == report
    assert report["skipped"] == {}
    assert report["n_samples"] == 12 and report["embedding_dim"] == 16 and report["n_classes"] == 3
    assert set(report["zero_shot"]) == {  # top5 is undefined with 3 classes
        "top1",
        "mean_per_class_recall",
        "n_templates",
        "templates",
        "class_names",
        "protocol",
    }
    assert report["zero_shot"]["class_names"] == "dataset"
    assert (
        report["zero_shot"]["templates"] == "custom" and report["zero_shot"]["protocol"] == "clip_benchmark"
    )
    assert report["retrieval"]["n_texts"] == 12  # every caption of every image (6 distinct strings)
    assert set(report["retrieval"]) == {
        "i2t_R@1",
        "i2t_R@5",
        "i2t_R@10",
        "t2i_R@1",
        "t2i_R@5",
        "t2i_R@10",
    } | {
        "n_texts",
        "protocol",
    }
    assert report["rsa"] == {"image": pytest.approx(1.0), "text": pytest.approx(1.0)}  # same weights
    assert report["linear_probe"]["n_train"] == 18
    assert set(report["granularity"]["cdnv_per_coarse"]) == {"0", "1", "2"}
    assert report["mmvp"]["n_pairs"] == 3 and set(report["mmvp"]["per_category"]) == {"colour", "hue"}
    for value in (report["zero_shot"]["top1"], report["clustering"]["acc"], report["mmvp"]["accuracy"]):
        assert 0.0 <= value <= 1.0


def test_evaluate_clip_matches_metrics_on_extracted_embeddings(clip):
    model, proc, tok = clip
    test = color_dataset(4)
    report = evaluation.evaluate_clip(
        model, proc, tok, test, tasks=("zero_shot", "clustering"), templates=TEMPLATES, mmvp=pairs_dataset()
    )
    image = model.get_image_features(
        pixel_values=proc(images=test["image"][:], return_tensors="pt")["pixel_values"]
    )
    image = image.pooler_output.detach()
    assert report["clustering"] == clustering_scores(image, test["label"][:], seed=0)

    def embed(texts):
        enc = tok(texts, padding=True, return_tensors="pt")
        return model.get_text_features(**enc).pooler_output.detach()

    classifier = zero_shot_classifier(embed, list(COLORS), TEMPLATES)  # filled verbatim (str.format)
    expected = zero_shot_accuracy(image, classifier, test["label"][:], (1,))
    assert {k: report["zero_shot"][k] for k in expected} == expected
    logits = evaluation.mmvp_logits(model, proc, tok, pairs_dataset())
    assert report["mmvp"] == mmvp_score(logits, pairs_dataset()["category"][:])


def test_evaluate_clip_on_the_shapes_world(clip):
    """The data package's contract: ClassLabel names, fine_label, MMVP-style pairs with extra columns."""
    from hf_vrl.data.toy import shapes_dataset, shapes_mmvp_pairs

    model, proc, tok = clip
    test = shapes_dataset(20, seed=0, image_size=16, split="test")
    pairs = shapes_mmvp_pairs(1, image_size=16)
    report = evaluation.evaluate_clip(model, proc, tok, test, tasks=("zero_shot", "granularity"), mmvp=pairs)
    assert report["skipped"] == {} and report["zero_shot"]["n_templates"] == 80  # no set: ImageNet's
    assert report["zero_shot"]["templates"] == "openai:imagenet (fallback)"
    assert report["n_classes"] == len(set(test["label"][:]))
    assert set(report["granularity"]["ncc_fine_per_coarse"]) == {str(c) for c in set(test["label"][:])}
    assert report["mmvp"]["n_pairs"] == len(pairs)
    assert set(report["mmvp"]["per_category"]) == set(pairs["category"][:])


def test_evaluate_clip_restores_the_training_mode():
    model = tiny_clip(0).train()
    evaluation.evaluate_clip(
        model, image_processor(), char_tokenizer(), color_dataset(2), tasks=("clustering",)
    )
    assert model.training


def test_encode_images_is_batch_size_invariant(clip):
    model, proc, _ = clip
    images = color_dataset(3)["image"]
    a = evaluation.encode_images(model, proc, images, batch_size=2)
    b = evaluation.encode_images(model, proc, images, batch_size=64)
    assert a.shape == (9, 16)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_reference_model_with_other_weights_gives_rsa_below_one(clip):
    model, proc, tok = clip
    report = evaluation.evaluate_clip(
        model, proc, tok, color_dataset(3), tasks=("rsa",), reference_model=tiny_clip(1)
    )
    assert -1.0 <= report["rsa"]["image"] < 0.999 and -1.0 <= report["rsa"]["text"] < 0.999


def test_missing_inputs_are_reported_as_skipped(clip):
    model, proc, tok = clip
    unlabeled = color_dataset(2).remove_columns(["label", "fine_label"])
    report = evaluation.evaluate_clip(
        model, proc, tok, unlabeled, tasks=("zero_shot", "retrieval", "linear_probe", "granularity", "rsa")
    )
    assert set(report["skipped"]) == {"zero_shot", "linear_probe", "granularity", "rsa"}
    assert "no class labels" in report["skipped"]["zero_shot"]
    assert "retrieval" in report and report["n_classes"] is None
    with pytest.raises(UserError, match="unknown tasks"):
        evaluation.evaluate_clip(model, proc, tok, unlabeled, tasks=("zero-shot",))


def test_vision_tower_gets_vision_only_tasks():
    torch.manual_seed(0)
    tower = CLIPVisionModel(CLIPVisionConfig(**VISION))
    tasks = ("zero_shot", "retrieval", "clustering", "granularity")
    report = evaluation.evaluate_clip(
        tower, image_processor(), None, color_dataset(3), tasks=tasks, mmvp=pairs_dataset()
    )
    assert report["embedding_dim"] == 32  # pooler_output of the tower
    assert {"zero_shot", "retrieval", "mmvp"} == set(report["skipped"])
    assert report["skipped"]["retrieval"] == "the model has no text tower"
    assert set(report["clustering"]) == {"nmi", "acc", "ari"} and "granularity" in report


def test_siglip_pads_to_max_length_so_embeddings_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    tok = char_tokenizer()
    text = dict(TOWER, vocab_size=len(tok), max_position_embeddings=24, pad_token_id=1)
    cfg = SiglipConfig(text_config=text, vision_config=VISION)
    model = SiglipModel(cfg).eval()
    assert evaluation._text_kwargs(model, tok) == {
        "padding": "max_length",
        "truncation": True,
        "max_length": 24,
    }
    alone = evaluation.encode_texts(model, tok, ["a red square"])
    batched = evaluation.encode_texts(model, tok, ["a red square", "a much longer dark green square"])
    torch.testing.assert_close(alone[0], batched[0], atol=1e-5, rtol=1e-5)
    clip_kwargs = evaluation._text_kwargs(tiny_clip(), tok)
    assert clip_kwargs == {"padding": True, "truncation": True, "max_length": 48}


@pytest.mark.gpu
def test_cuda_half_precision_embeddings_match_cpu(clip):
    model, proc, tok = clip
    ds = color_dataset(3)
    cpu = evaluation.encode_images(model, proc, ds["image"])
    gpu = evaluation.encode_images(copy.deepcopy(model).to("cuda", torch.float16), proc, ds["image"])
    assert gpu.device.type == "cpu" and gpu.dtype == torch.float32
    torch.testing.assert_close(gpu, cpu, atol=1e-2, rtol=1e-2)
    tasks = ("zero_shot", "retrieval")
    report = evaluation.evaluate_clip(copy.deepcopy(model), proc, tok, ds, tasks=tasks, device="cuda")
    assert report["skipped"] == {} and report["n_samples"] == 9


class ColorCLIP(torch.nn.Module):
    """A hand-wired "CLIP": images embed as their mean RGB, texts as the colour word they contain."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def get_image_features(self, pixel_values):
        return pixel_values.mean(dim=(2, 3))

    def get_text_features(self, input_ids, attention_mask=None):
        return input_ids.float()


def color_tokenizer(texts, return_tensors="pt", **kwargs):
    names = list(COLORS)
    ids = [[float(name in re.findall(r"[a-z]+", t)) for name in names] for t in texts]
    return {"input_ids": torch.tensor(ids)}


def color_processor(images, return_tensors="pt"):
    return {
        "pixel_values": torch.stack(
            [torch.tensor(np.asarray(im), dtype=torch.float32).permute(2, 0, 1) for im in images]
        )
    }


def test_mmvp_wiring_statement_a_belongs_to_image_a():
    pairs = pairs_dataset()
    out = evaluation.evaluate_mmvp(ColorCLIP(), color_processor, color_tokenizer, pairs)
    assert out["accuracy"] == 1.0 and out["statement_accuracy"] == 1.0
    swapped = pairs.rename_columns({"statement_a": "statement_b", "statement_b": "statement_a"})
    assert evaluation.evaluate_mmvp(ColorCLIP(), color_processor, color_tokenizer, swapped)["accuracy"] == 0.0


def test_mmvp_from_an_official_directory(mmvp_dir):
    out = evaluation.evaluate_mmvp(
        ColorCLIP(), color_processor, color_tokenizer, mmvp_dir, allow_partial=True
    )
    assert out["per_category"] == {"Orientation and Direction": 1.0} and out["n_pairs"] == 3


# -- protocols: clip_benchmark (default) and hf_vrl


def hand_dataset(class_names=("red", "blue")):
    """Four exact-colour images (ColorCLIP embeds them as their RGB): two per class, each captioned with its
    class's one string, as template captions are."""
    rgbs = [(255, 0, 0), (200, 150, 0), (0, 0, 255), (0, 150, 200)]
    rows = {
        "image": [Image.new("RGB", (4, 4), rgb) for rgb in rgbs],
        "caption": ["a red square", "a red square", "a blue square", "a blue square"],
        "label": [0, 0, 1, 1],
    }
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "caption": datasets.Value("string"),
            "label": datasets.ClassLabel(names=list(class_names)),
        }
    )
    return datasets.Dataset.from_dict(rows, features=features)


def test_retrieval_protocols_on_hand_made_embeddings():
    """Images red [1, 0, 0], [.8, .6, 0], blue [0, 0, 1], [0, .6, .8]; captions "red" [1, 0, 0] x2, "blue"
    [0, 0, 1] x2. clip_benchmark: image 0's own caption ties with image 1's identical one (i2t R@1 = 1/2 for
    every image); caption 1 ("red" of image 1) finds image 0 first (1.0 > 0.8), caption 0 finds its own (t2i
    R@1 = 1/2). hf_vrl: two distinct texts, each image's caption ranks first, each text's first image is one
    of its images: 1.0 both ways."""
    ds = hand_dataset()
    run = {"tasks": ("retrieval",), "batch_size": 3}
    cb = evaluation.evaluate_clip(ColorCLIP(), color_processor, color_tokenizer, ds, **run)["retrieval"]
    not_reported = "R@5, R@10: 4 images and {} texts (K must not exceed them)"  # 4 images: R@1 alone
    assert cb == {
        "i2t_R@1": 0.5,
        "t2i_R@1": 0.5,
        "n_texts": 4,
        "protocol": "clip_benchmark",
        "not_reported": not_reported.format(4),
    }
    old = evaluation.evaluate_clip(
        ColorCLIP(), color_processor, color_tokenizer, ds, protocol="hf_vrl", **run
    )
    assert old["retrieval"] == {
        "i2t_R@1": 1.0,
        "t2i_R@1": 1.0,
        "n_texts": 2,
        "protocol": "hf_vrl",
        "not_reported": "R@5, R@10: 4 images and 2 texts (K must not exceed them)",
    }


def test_retrieval_uses_every_caption_of_an_image():
    """A `caption` column of lists: image i's captions are all its texts (clip_benchmark's COCO / Flickr)."""
    hand = hand_dataset()
    features = datasets.Features({**hand.features, "caption": datasets.Sequence(datasets.Value("string"))})
    captions = [[caption] * (1 + i % 2) for i, caption in enumerate(hand["caption"])]
    ds = datasets.Dataset.from_dict({**hand.to_dict(), "caption": captions}, features=features)
    report = evaluation.evaluate_clip(ColorCLIP(), color_processor, color_tokenizer, ds, tasks=("retrieval",))
    assert report["retrieval"]["n_texts"] == 6
    # image 1 owns 2 of the 3 "red" captions: R@1 2/3; image 0 owns 1 of 3: 1/3 (blue: the same)
    assert report["retrieval"]["i2t_R@1"] == pytest.approx((1 / 3 + 2 / 3 + 1 / 3 + 2 / 3) / 4)


class RecordingTokenizer:
    """color_tokenizer that keeps every text it is given."""

    def __init__(self):
        self.seen = []

    def __call__(self, texts, **kwargs):
        self.seen += list(texts)
        return color_tokenizer(texts)


def test_zero_shot_prompts_follow_the_protocol():
    """clip_benchmark: OpenAI's set for the dataset (here read off dataset.info), filled verbatim ("a apple");
    hf_vrl: its 8 templates, "a {}" -> "an {}" before a vowel."""
    ds = hand_dataset(class_names=("apple", "red"))
    info = datasets.DatasetInfo(dataset_name="cifar10", features=ds.features)
    ds = datasets.Dataset.from_dict(ds.to_dict(), features=ds.features, info=info)
    tok = RecordingTokenizer()
    report = evaluation.evaluate_clip(ColorCLIP(), color_processor, tok, ds, tasks=("zero_shot",))
    cifar = OPENAI_TEMPLATES["cifar10"]
    assert tok.seen == [t.format(name) for name in ("apple", "red") for t in cifar]
    assert "a photo of a apple." in tok.seen
    assert report["zero_shot"]["templates"] == "openai:cifar10" and report["zero_shot"]["n_templates"] == 18
    # "apple" embeds as 0, so its clip_benchmark class weight is 0 / 0 = NaN, which torch.topk ranks first, as
    # clip_benchmark would: every image is called "apple", right for images 0 and 1
    assert report["zero_shot"]["top1"] == 0.5

    tok = RecordingTokenizer()
    report = evaluation.evaluate_clip(
        ColorCLIP(), color_processor, tok, ds, tasks=("zero_shot",), protocol="hf_vrl"
    )
    assert tok.seen[0] == "a photo of an apple." and len(tok.seen) == 2 * len(ZERO_SHOT_TEMPLATES)
    assert report["zero_shot"]["templates"] == "hf_vrl" and report["zero_shot"]["protocol"] == "hf_vrl"


def test_zero_shot_prompts_lookup():
    prompts = evaluation.zero_shot_prompts
    assert prompts(dataset_name="digits").templates == OPENAI_TEMPLATES["mnist"]
    assert prompts(dataset_name="digits").source == "openai:mnist"
    assert prompts(dataset_name="cub:/data/CUB_200_2011").templates == ("a photo of a {}, a type of bird.",)
    fallback = prompts(dataset_name="fashion_mnist")
    assert len(fallback.templates) == 80 and fallback.source == "openai:imagenet (fallback)"
    assert prompts(dataset_name="fashion_mnist", templates="cars").source == "openai:stanford_cars"
    assert prompts(templates=["a {}"]).source == "custom" and prompts(templates=["a {}"]).fill is str.format
    legacy = prompts("hf_vrl", dataset_name="cifar10")
    assert legacy.templates == ZERO_SHOT_TEMPLATES and legacy.fill("a {}", "owl") == "an owl"
    with pytest.raises(UserError, match="no template set named 'nope'"):
        prompts(templates="nope")
    with pytest.raises(UserError, match="unknown protocol"):
        prompts("open_clip")


def test_openai_templates_are_shipped_verbatim():
    """Spot checks against openai/CLIP data/prompts.md and Prompt_Engineering_for_ImageNet.ipynb."""
    from hf_vrl.data.prompts import IMAGENET_TEMPLATES

    sizes = {name: len(templates) for name, templates in OPENAI_TEMPLATES.items()}
    assert len(sizes) == 27 and sizes["imagenet"] == 80 and IMAGENET_TEMPLATES is OPENAI_TEMPLATES["imagenet"]
    assert sizes["cifar10"] == sizes["cifar100"] == sizes["resisc45"] == 18 and sizes["caltech101"] == 34
    assert (
        sizes["stanford_cars"] == sizes["dtd"] == 8 and sizes["ucf101"] == 48 and sizes["kinetics700"] == 28
    )
    assert (IMAGENET_TEMPLATES[0], IMAGENET_TEMPLATES[-1]) == ("a bad photo of a {}.", "a tattoo of the {}.")
    assert "a origami {}." in IMAGENET_TEMPLATES  # OpenAI's grammar, kept
    assert OPENAI_TEMPLATES["mnist"] == ('a photo of the number: "{}".',)
    assert OPENAI_TEMPLATES["food101"] == ("a photo of {}, a type of food.",)
    assert OPENAI_TEMPLATES["fgvc_aircraft"] == (
        "a photo of a {}, a type of aircraft.",
        "a photo of the {}, a type of aircraft.",
    )
    assert all(t.count("{}") == 1 for templates in OPENAI_TEMPLATES.values() for t in templates)


def test_on_task_end_sees_the_report_grow(clip):
    model, proc, tok = clip
    snapshots = []
    evaluation.evaluate_clip(
        model,
        proc,
        tok,
        color_dataset(2),
        tasks=("zero_shot", "clustering"),
        mmvp=pairs_dataset(),
        on_task_end=lambda report: snapshots.append(
            sorted(k for k in ("zero_shot", "clustering", "mmvp") if k in report)
        ),
    )
    assert snapshots == [["zero_shot"], ["clustering", "zero_shot"], ["clustering", "mmvp", "zero_shot"]]


def test_text_only_model_is_refused_in_one_line(tmp_path):
    from transformers import CLIPTextConfig, CLIPTextModel

    text_model = CLIPTextModel(CLIPTextConfig(**TOWER, vocab_size=50, max_position_embeddings=16))
    with pytest.raises(UserError, match="CLIPTextModel embeds no images") as error:
        evaluation.evaluate_clip(text_model, image_processor(), char_tokenizer(), color_dataset(1))
    assert "\n" not in str(error.value)
    text_model.save_pretrained(tmp_path / "text")
    out = tmp_path / "out"
    with pytest.raises(UserError, match="embeds no images"):
        eval_command.main(
            ["--model", str(tmp_path / "text"), "--dataset", "shapes", "--output-dir", str(out)]
        )
    assert not out.exists()  # refused before anything is written


# -- the device rule: inputs built on the CPU go to the model's device


def test_helpers_run_on_the_models_device(clip, device):
    model, proc, tok = clip
    on_device = copy.deepcopy(model).to(device)
    ds, pairs = color_dataset(2), pairs_dataset()
    cpu_images = evaluation.encode_images(model, proc, ds["image"])
    images = evaluation.encode_images(on_device, proc, ds["image"])
    assert images.device.type == "cpu"
    torch.testing.assert_close(images, cpu_images, atol=1e-4, rtol=1e-4)
    texts = ["a red square", "a dark blue square"]
    torch.testing.assert_close(
        evaluation.encode_texts(on_device, tok, texts),
        evaluation.encode_texts(model, tok, texts),
        atol=1e-4,
        rtol=1e-4,
    )
    np.testing.assert_allclose(
        evaluation.mmvp_logits(on_device, proc, tok, pairs),
        evaluation.mmvp_logits(model, proc, tok, pairs),
        atol=1e-4,
    )
    reference = copy.deepcopy(model)  # on the CPU: it moves with the model it serves
    tasks = ("zero_shot", "retrieval", "clustering", "rsa")
    kwargs = {"tasks": tasks, "mmvp": pairs, "templates": TEMPLATES}
    report = evaluation.evaluate_clip(on_device, proc, tok, ds, reference_model=reference, **kwargs)
    assert next(reference.parameters()).device.type == device.type
    expected = evaluation.evaluate_clip(model, proc, tok, ds, reference_model=copy.deepcopy(model), **kwargs)
    assert report.keys() == expected.keys()
    for task in tasks:
        assert report[task] == pytest.approx(expected[task], abs=1e-4)
    assert report["mmvp"]["per_category"] == pytest.approx(expected["mmvp"]["per_category"], abs=1e-4)


# -- the `hf-vrl eval` command


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-clip")
    tiny_clip(0).save_pretrained(path)
    CLIPProcessor(image_processor=image_processor(), tokenizer=char_tokenizer()).save_pretrained(path)
    return path


@pytest.fixture
def registry(monkeypatch):
    """Stand-in for hf_vrl.data.registry: records the calls, serves the inline colour datasets."""
    calls = []

    def load(name, *, split, limit=None, image_size=None, seed=0, sample_filter=None):
        calls.append((name, split, limit, image_size, seed))
        ds = color_dataset(6 if split == "train" else 4, seed=int(split == "train"))
        return ds.select(range(min(limit, len(ds)))) if limit else ds

    monkeypatch.setattr(eval_inputs, "load_eval_dataset", load)
    # the names it serves are not the real registry's: its preflight check stands aside too
    monkeypatch.setattr("hf_vrl.run.preflight.check_data", lambda name, what="--dataset": None)
    return calls


def test_main_writes_report_and_figures(clip_dir, mmvp_dir, registry, tmp_path):
    out = tmp_path / "run"
    argv = ["--model", str(clip_dir), "--dataset", "colors", "--limit", "10", "--image-size", "16"]
    argv += ["--mmvp-dir", str(mmvp_dir), "--allow-partial", "--output-dir", str(out), "--batch-size", "4"]
    assert eval_command.main(argv) == 0
    assert registry == [("colors", "test", 10, 16, 0), ("colors", "train", 10000, 16, 0)]  # probe capped
    report = json.loads((out / "report.json").read_text())
    assert report["model"] == str(clip_dir) and report["dataset"] == "colors" and report["n_samples"] == 10
    assert {"zero_shot", "retrieval", "clustering", "linear_probe", "mmvp"} <= set(report)
    assert report["skipped"] == {} and report["mmvp"]["n_pairs"] == 3
    assert report["figures"] == ["embeddings_pca.png", "mmvp.png"]
    for name in report["figures"]:
        assert (out / name).read_bytes()[:8] == PNG


def test_main_vision_tower_and_mmvp_only(tmp_path, registry, mmvp_dir, clip_dir):
    tower_dir = tmp_path / "tower"
    torch.manual_seed(0)
    CLIPVisionModel(CLIPVisionConfig(**VISION)).save_pretrained(tower_dir)
    image_processor().save_pretrained(tower_dir)
    out = tmp_path / "tower-run"
    argv = ["--model", str(tower_dir), "--dataset", "colors", "--tasks", "clustering", "zero_shot"]
    assert eval_command.main(argv + ["--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["skipped"] == {"zero_shot": "the model has no text tower"}
    assert report["figures"] == ["embeddings_pca.png"] and (out / "embeddings_pca.png").is_file()
    assert registry == [("colors", "test", None, None, 0)]  # no train split without linear_probe

    mmvp_out = tmp_path / "mmvp-run"
    argv = ["--model", str(clip_dir), "--mmvp-dir", str(mmvp_dir), "--allow-partial"]
    assert eval_command.main([*argv, "--output-dir", str(mmvp_out)]) == 0
    report = json.loads((mmvp_out / "report.json").read_text())
    assert report["mmvp"]["n_pairs"] == 3 and report["figures"] == ["mmvp.png"]


def test_main_help_and_usage_errors(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        eval_command.main(["--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--model", "--dataset", "--tasks", "--mmvp-dir", "--output-dir", "--trust-remote-code"):
        assert flag in help_text
    with pytest.raises(SystemExit) as exc:
        eval_command.main(["--model", "x", "--output-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "--dataset, --mmvp-dir or both" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_command.main(
            ["--model", "x", "--dataset", "d", "--tasks", "bogus", "--output-dir", str(tmp_path)]
        )


def test_help_lists_every_dataset_name_prefix_and_layout_of_the_registry(capsys):
    """`hf-vrl eval --help` lists the spellings --dataset takes and each benchmark's layouts, from the
    registry itself."""
    from hf_vrl.data import registry
    from hf_vrl.data.benchmarks import BENCHMARKS
    from hf_vrl.data.layouts import all_layouts

    with pytest.raises(SystemExit):
        eval_command.main(["--help"])
    text = capsys.readouterr().out
    assert all(name in text for name in registry.NAMED)
    assert all(f"{prefix}:<path>" in text for prefix in registry.PREFIXES)
    for key, benchmark in BENCHMARKS.items():
        line = next(line for line in text.splitlines() if line.startswith(f"  {key}: "))
        assert all(all_layouts()[name].description in line for name in benchmark.layouts), key


def test_a_probe_on_a_small_copy_is_one_line_and_runs_with_a_given_c(clip_dir, tmp_path, capsys):
    """A train split too small to choose C on a validation split: one line naming --probe-c (not a
    traceback); with --probe-c the probe runs at that C and the report records it."""
    from hf_vrl.cli import main

    argv = ["eval", "--model", str(clip_dir), "--dataset", "shapes", "--limit", "12", "--train-limit", "3"]
    argv += ["--image-size", "16", "--tasks", "linear_probe", "--no-figures"]
    assert main([*argv, "--output-dir", str(tmp_path / "a")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "--probe-c" in err[0]
    assert "linear probe: 3 training samples in 3 classes" in err[0]
    assert main([*argv, "--probe-c", "0.5", "--output-dir", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["probe_c"] == 0.5 and report["linear_probe"]["C"] == 0.5
    assert report["linear_probe"]["val_accuracies"] == {}


def test_hf_vrl_eval_scores_objectnet_without_its_border_as_dive_does(clip_dir, tmp_path, monkeypatch):
    """The 2-pixel border crop of FLYP / WiSE-FT (and DiVE's evaluation) belongs to ObjectNet's evaluation:
    `hf-vrl eval --dataset objectnet:<folder>` embeds the cropped images and its report says so."""
    from PIL import Image

    images = tmp_path / "objectnet-1.0" / "images"
    for i, folder in enumerate(("alarm_clock", "banana", "alarm_clock")):
        (images / folder).mkdir(parents=True, exist_ok=True)
        image = Image.new("RGB", (20, 20), (200, 10 * i, 0))
        image.paste((0, 0, 255), (2, 2, 18, 18))
        image.save(images / folder / f"{i}.png")
    seen, encode_images = [], evaluation.encode_images

    def spy(model, processor, column, **kwargs):
        seen.extend(column[0 : len(column)])
        return encode_images(model, processor, column, **kwargs)

    monkeypatch.setattr(evaluation, "encode_images", spy)
    argv = ["--model", str(clip_dir), "--dataset", f"objectnet:{tmp_path}", "--allow-partial", "--no-figures"]
    assert eval_command.main([*argv, "--tasks", "clustering", "--output-dir", str(tmp_path / "out")]) == 0
    assert [im.size for im in seen] == [(16, 16)] * 3
    assert all(im.getcolors() == [(256, (0, 0, 255))] for im in seen)
    assert json.loads((tmp_path / "out" / "report.json").read_text())["border_crop"] == 2


def test_main_with_the_registry_shapes_world(clip_dir, tmp_path):
    out = tmp_path / "shapes"
    argv = ["--model", str(clip_dir), "--dataset", "shapes", "--limit", "24", "--image-size", "16"]
    argv += ["--tasks", "zero_shot", "clustering", "granularity", "--no-figures"]
    assert eval_command.main(argv + ["--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["n_samples"] == 24 and {"zero_shot", "clustering", "granularity"} <= set(report)
    assert report["skipped"] == {} and "figures" not in report
    measured_on = {
        "dataset": "shapes",
        "split": "test",
        "n_samples": 24,
        "limit": 24,
        "seed": 0,
        "drawn": "generated",
        "texts": "generated",
    }
    for task in ("zero_shot", "clustering", "granularity"):  # each section says what it was measured on
        assert report[task]["data"] == measured_on, task


def test_streamed_sources_are_materialised_with_a_limit(monkeypatch):
    streamed = color_dataset(2).to_iterable_dataset()
    monkeypatch.setattr(eval_inputs, "load_dataset_by_name", lambda name, **kwargs: streamed)
    ds = eval_inputs.load_eval_dataset("webdataset:x", split="train", limit=6)
    assert isinstance(ds, datasets.Dataset) and len(ds) == 6
    assert ds.features["label"].names == list(COLORS)
    with pytest.raises(UserError, match="--limit"):
        eval_inputs.load_eval_dataset("webdataset:x", split="train")


def test_main_logs_each_task_and_rewrites_the_report_as_tasks_finish(clip_dir, registry, tmp_path, caplog):
    out = tmp_path / "run"
    snapshots = []
    real_write = eval_command.atomic_write_json

    def write_and_read_back(path, data):
        real_write(path, data)
        snapshots.append(json.loads(path.read_text()))

    argv = ["--model", str(clip_dir), "--dataset", "colors", "--no-figures", "--output-dir", str(out)]
    with caplog.at_level(logging.INFO, logger="hf_vrl"), pytest.MonkeyPatch.context() as patch:
        patch.setattr(eval_command, "atomic_write_json", write_and_read_back)
        assert eval_command.main(argv) == 0
    tasks = list(evaluation.DEFAULT_TASKS)
    assert [[t for t in tasks if t in s] for s in snapshots] == [
        tasks[:1],
        tasks[:2],
        tasks[:3],
        tasks,
        tasks,
    ]
    assert [s["complete"] for s in snapshots] == [False, False, False, False, True]
    assert snapshots[-1]["protocol"] == "clip_benchmark" and snapshots[-1]["train_limit"] == 10000
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("hf_vrl")]
    for number, task in enumerate(tasks, start=1):
        assert any(m.startswith(f"[{number}/4] {task}: ") for m in messages), messages


def test_preset_without_weights_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="cannot load a model from 'tiny-clip'.*runs/demo/clip/final"):
        eval_command.main(
            ["--model", "tiny-clip", "--dataset", "shapes", "--output-dir", str(tmp_path / "o")]
        )


def help_example(capsys) -> list[str]:
    """The arguments of the example that `hf-vrl eval --help` prints."""
    with pytest.raises(SystemExit):
        eval_command.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    return help_text.split("example (after `make demo`): hf-vrl eval ", 1)[1].split()


@pytest.fixture
def after_make_demo(clip_dir, tmp_path, monkeypatch):
    """A working directory holding a model where `make demo` saves the CLIP one."""
    import shutil

    from hf_vrl.data.offline import FASHION_MNIST_DIR

    if not (FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    shutil.copytree(clip_dir, tmp_path / "runs" / "demo" / "clip" / "final")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_help_example_works_after_make_demo(capsys, after_make_demo):
    argv = help_example(capsys)
    assert argv[argv.index("--model") + 1] == "runs/demo/clip/final"
    assert eval_command.main([*argv, "--limit", "60", "--train-limit", "100", "--no-figures"]) == 0
    report = json.loads((after_make_demo / "runs" / "eval" / "report.json").read_text())
    assert report["complete"] and report["n_samples"] == 60 and report["linear_probe"]["n_train"] == 100
    assert report["zero_shot"]["templates"] == "openai:imagenet (fallback)"


@pytest.mark.slow
def test_help_example_with_default_settings(capsys, after_make_demo):
    """The full Fashion-MNIST test set and the default probe cap (a few minutes on 2 cores)."""
    assert eval_command.main(help_example(capsys)) == 0
    report = json.loads((after_make_demo / "runs" / "eval" / "report.json").read_text())
    assert report["complete"] and report["n_samples"] == 10000
    assert report["linear_probe"]["n_train"] == evaluation.DEFAULT_PROBE_TRAIN_LIMIT
