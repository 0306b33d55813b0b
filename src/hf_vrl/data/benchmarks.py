"""The benchmarks the papers' tables use, as data: one registry read by every reproduce script, `hf-vrl eval`
and the presets (through the registry names `<key>:<path>`, `hf_vrl.data.registry`).

Each `Benchmark` says which layouts it loads as published (`hf_vrl.data.layouts`), its splits with the
official image / class / caption counts (checked before anything is scored: `check_counts`), the class names
and prompt templates its zero-shot rows use and where they come from, and the label level each paper table
scores. Counts are the publishers' numbers (`counts_source`). Where the publisher defines no split, the
split its published layout is read with is counted (SUN397: the publisher's first partition; UCF-101: its
split 1; Caltech-101: 30 images a class for train as tfds draws them; EuroSAT: the whole set as the test
set, clip_benchmark's torchvision reading; its Hub mirror is VTAB's, 5,400 test), and a split left to the
user has its class count checked only (`images=None`). `MIRRORS`: each benchmark's copies on the Hub, with
their own counts, and where scoring them differs from the registry's reading (the papers' protocol as
hf_vrl implements it; a paper that states another split says so in README).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hf_vrl.errors import UserError

from .hub import is_hub_spec, parse_hub_spec
from .imagenet_classes import IMAGENET_CLASSNAMES, IMAGENET_WNIDS
from .prompts import _named_in, _normalise, imagenet_class_names, imagenet_class_wnids, imagenet_family
from .transfer_classes import FMOW_CATEGORIES, IWILDCAM_CLASSNAMES, IWILDCAM_LABELS, OPENAI_CLASSNAMES

__all__ = [
    "BENCHMARKS",
    "CLIP_BENCHMARK_LAYOUT",
    "FINE_LEVELS",
    "Benchmark",
    "HubMirror",
    "Counts",
    "Split",
    "benchmark_name",
    "benchmark_of",
    "benchmark_of_repo",
    "openai_class_names",
    "check_counts",
]


@dataclass(frozen=True)
class Split:
    """A split's official size: images (MMVP: pairs), classes present, captions (retrieval); None where the
    publisher gives no number."""

    images: int | None
    classes: int | None = None
    texts: int | None = None


@dataclass(frozen=True)
class HubMirror:
    """A copy of a benchmark on the Hugging Face Hub: its repo, the layout it is read with, its own splits
    (by the mirror's names) with its own counts and their source (None where unverified), the benchmark's
    split names in the mirror's, and where scoring it differs from the registry's reading of the benchmark
    (the papers' protocol as hf_vrl implements it)."""

    repo_id: str
    layout: str
    splits: Mapping[str, Split]
    counts_source: str
    split_names: Mapping[str, str] = field(default_factory=dict)  # the benchmark's split -> the mirror's
    differs: str = ""

    def split(self, official: str) -> str:
        """The mirror's name of the benchmark's split `official`."""
        return self.split_names.get(official, official)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: the layouts it loads (first: the publisher's), its splits and their official counts,
    the classes in label order with their source, the zero-shot templates and the label level per table."""

    key: str
    title: str
    task: str  # "classification", "retrieval", "pairs" (MMVP) or "image-text" (a training corpus)
    layouts: tuple[str, ...]
    splits: Mapping[str, Split]
    counts_source: str
    aliases: Mapping[str, str] = field(default_factory=dict)  # other names of the splits
    class_names: tuple[str, ...] | None = None  # the labels' names (the ImageNet family: WordNet ids)
    class_names_source: str = ""
    prompt_names: tuple[str, ...] | None = (
        None  # the names prompts use, where the labels' differ (may repeat)
    )
    templates: str | None = None  # a key of hf_vrl.data.prompts.OPENAI_TEMPLATES / FLYP_TEMPLATES
    templates_source: str = ""
    levels: Mapping[str, str] = field(default_factory=dict)  # paper table -> label level it scores
    mirrors: tuple[HubMirror, ...] = ()  # its copies on the Hub (`hf_vrl.data.benchmarks.MIRRORS`)

    def mirror(self, layout: str | None = None, repo_id: str | None = None) -> HubMirror | None:
        """Its Hub mirror read with `layout` (or the one of repo `repo_id`), None when it has none."""
        return next(
            (m for m in self.mirrors if m.layout == layout or (repo_id and m.repo_id == repo_id)), None
        )

    def split(self, name: str) -> str:
        """The official name of split `name` (an alias such as "val" or "test" maps to it)."""
        official = self.aliases.get(name, name)
        if official not in self.splits:
            names = sorted({*self.splits, *self.aliases})
            raise UserError(f"{self.title} has no split {name!r}; its splits: {', '.join(names)}")
        return official


def _imagenet_wnids(member: str | None = None) -> tuple[str, ...]:
    """The WordNet ids of an ImageNet-family set in label order (its labels: OpenAI's names repeat two)."""
    return tuple(imagenet_class_wnids(member))


OPENAI_NAMES = "OpenAI's (openai/CLIP data/prompts.md, as LAION-AI/CLIP_benchmark ships them)"
OPENAI_IMAGENET = (
    "labels by WordNet id; prompts with OpenAI's curated ImageNet names (openai/CLIP notebooks/"
    "Prompt_Engineering_for_ImageNet.ipynb; CLIP_benchmark en_classnames.json 'imagenet1k')"
)
OPENAI_TEMPLATES_SOURCE = "OpenAI's (openai/CLIP data/prompts.md)"
IMAGENET_TEMPLATES_SOURCE = "OpenAI's 80 (Prompt_Engineering_for_ImageNet.ipynb)"
GENERIC = ("split-folders", "hf")


def _classification(
    key: str,
    title: str,
    splits: Mapping[str, Split],
    source: str,
    *,
    layouts: tuple[str, ...] = GENERIC,
    templates: str | None = None,
    **kwargs: Any,
) -> Benchmark:
    """A classification set of the CLIP paper's transfer suite: OpenAI's names and templates under `key`."""
    templates = templates or key
    return Benchmark(
        key,
        title,
        "classification",
        layouts,
        splits,
        source,
        class_names=OPENAI_CLASSNAMES[templates],
        class_names_source=OPENAI_NAMES,
        templates=templates,
        templates_source=OPENAI_TEMPLATES_SOURCE,
        **kwargs,
    )


def _imagenet_member(
    key: str, title: str, layouts: tuple[str, ...], test: Split, source: str, **kw
) -> Benchmark:
    member = "imagenet-r" if key == "imagenet-r" else "imagenet-a" if key == "imagenet-a" else None
    return Benchmark(
        key,
        title,
        "classification",
        layouts,
        {"test": test},
        source,
        aliases={"train": "test", "validation": "test", "val": "test"},  # one split, however it is called
        class_names=_imagenet_wnids(member),
        class_names_source=OPENAI_IMAGENET,
        prompt_names=tuple(imagenet_class_names(member)),
        templates="imagenet",
        templates_source=IMAGENET_TEMPLATES_SOURCE,
        **kw,
    )


def _retrieval(key: str, title: str, test: Split, source: str) -> Benchmark:
    return Benchmark(key, title, "retrieval", ("karpathy", "hf-captions"), {"test": test}, source)


_TABLES = {
    "dcr2": "DCR Table 2 (zero-shot clustering)",
    "dcr6": "DCR Table 6 (zero-shot classification)",
    "diffclip1": "DiffCLIP Table 1 (linear probe, few-shot)",
    "diffclip2": "DiffCLIP Table 2 / Fig. 3 (zero-shot)",
    "dive3": "DiVE Table 3 (zero-shot transfer)",
    "dive2": "DiVE Tables 2, 8 (ID / OOD)",
    "clue": "CLUE Tables 2, 3 (probe, retrieval; granularity)",
}


def _levels(*tables: str, level: str = "class") -> dict[str, str]:
    return {_TABLES[t]: level for t in tables}


_PUBLISHED: dict[str, Benchmark] = {
    b.key: b
    for b in (
        Benchmark(
            "imagenet",
            "ImageNet-1k (ILSVRC-2012)",
            "classification",
            ("ilsvrc", "split-folders", "hf"),
            {"train": Split(1_281_167, 1000), "validation": Split(50_000, 1000)},
            "Russakovsky et al. 2015 (ILSVRC-2012 devkit): 1,281,167 train, 50,000 validation images, 1,000 "
            "classes",
            aliases={
                "test": "validation",
                "val": "validation",
            },  # the papers' ImageNet test is its validation set
            class_names=_imagenet_wnids(),
            class_names_source=OPENAI_IMAGENET,
            prompt_names=tuple(imagenet_class_names()),
            templates="imagenet",
            templates_source=IMAGENET_TEMPLATES_SOURCE,
            levels=_levels("dcr2", "dcr6", "diffclip2", "dive2"),
        ),
        _imagenet_member(
            "imagenet-v2",
            "ImageNet-V2 (matched frequency)",
            ("imagenetv2", "split-folders", "hf"),
            Split(10_000, 1000),
            "Recht et al. 2019: 10,000 images, 10 per class",
            levels=_levels("diffclip2", "dive2"),
        ),
        _imagenet_member(
            "imagenet-r",
            "ImageNet-R",
            ("wnid-folders", "split-folders", "hf"),
            Split(30_000, 200),
            "Hendrycks et al. 2021a: 30,000 renditions of 200 ImageNet classes",
            levels=_levels("diffclip2", "dive2", level="class (the 200 of ImageNet-R)"),
        ),
        _imagenet_member(
            "imagenet-a",
            "ImageNet-A",
            ("wnid-folders", "split-folders", "hf"),
            Split(7_500, 200),
            "Hendrycks et al. 2021b: 7,500 natural adversarial examples of 200 ImageNet classes",
            levels=_levels("diffclip2", "dive2", level="class (the 200 of ImageNet-A)"),
        ),
        _imagenet_member(
            "imagenet-sketch",
            "ImageNet-Sketch",
            ("wnid-folders", "split-folders", "hf"),
            Split(50_889, 1000),
            "Wang et al. 2019: 50,889 sketches, 1,000 classes",
            levels=_levels("diffclip2", "dive2"),
        ),
        Benchmark(
            "objectnet",
            "ObjectNet (the 113 classes mapped to ImageNet)",
            "classification",
            ("objectnet",),
            {"test": Split(18_574, 113)},
            "Barbu et al. 2019 (50,000 images, 313 classes); the 113 classes FLYP / WiSE-FT map to ImageNet "
            "hold 18,574 of them",
            aliases={"train": "test", "validation": "test", "val": "test"},
            class_names_source="its folder names, scored through FLYP's folder -> ImageNet mapping with "
            "OpenAI's ImageNet names (maximum over each folder's ImageNet classes)",
            templates="imagenet",
            templates_source=IMAGENET_TEMPLATES_SOURCE,
            levels=_levels("dive2", level="class (113 folders, each the max over its ImageNet classes)"),
        ),
        Benchmark(
            "cub",
            "CUB-200-2011",
            "classification",
            ("cub", "hf"),
            {"train": Split(5_994, 200), "test": Split(5_794, 200)},
            "Wah et al. 2011: 5,994 train, 5,794 test images, 200 species",
            class_names_source="the publisher's classes.txt, cleaned ('001.Black_footed_Albatross' -> "
            "'black footed albatross')",
            templates="birdsnap",
            templates_source="OpenAI's Birdsnap template (hf_vrl's choice: OpenAI has no CUB set)",
            levels=_levels("clue", level="species (200)"),
        ),
        _classification(
            "aircraft",
            "FGVC-Aircraft",
            {
                "train": Split(6_667, 100),
                "test": Split(3_333, 100),
                "train_only": Split(3_334, 100),
                "validation": Split(3_333, 100),
            },
            "Maji et al. 2013: train 3,334 + val 3,333 = trainval 6,667, test 3,333 images; 100 variants, 70 "
            "families, 30 manufacturers",
            layouts=("fgvc-aircraft", *GENERIC),
            templates="fgvc_aircraft",
            aliases={"trainval": "train", "val": "validation"},
            levels={
                **_levels("diffclip1", "dive3", level="variant (100)"),
                **_levels("clue", level="variant (100); family (70) as the coarse level of granularity"),
            },
        ),
        _classification(
            "cars",
            "Stanford Cars",
            {"train": Split(8_144, 196), "test": Split(8_041, 196)},
            "Krause et al. 2013: 8,144 train, 8,041 test images, 196 classes",
            layouts=("cars-devkit", "cars-folders", "hf"),
            templates="stanford_cars",
            levels={
                **_levels("dive3", level="model (196)"),
                **_levels("clue", level="model (196); make (49) as the coarse level of granularity"),
            },
        ),
        _classification(
            "cifar10",
            "CIFAR-10",
            {"train": Split(50_000, 10), "test": Split(10_000, 10)},
            "Krizhevsky 2009: 50,000 train, 10,000 test images",
            layouts=("cifar-10-python", *GENERIC),
            levels=_levels("dcr2", "dcr6", "diffclip1"),
        ),
        _classification(
            "cifar100",
            "CIFAR-100",
            {"train": Split(50_000, 100), "test": Split(10_000, 100)},
            "Krizhevsky 2009: 50,000 train, 10,000 test images, 100 fine classes",
            layouts=("cifar-100-python", *GENERIC),
            levels=_levels("diffclip1", level="fine class (100)"),
        ),
        _classification(
            "mnist",
            "MNIST",
            {"train": Split(60_000, 10), "test": Split(10_000, 10)},
            "LeCun et al. 1998: 60,000 train, 10,000 test images",
            layouts=("mnist-idx", *GENERIC),
            levels=_levels("dcr2", "dcr6"),
        ),
        _classification(
            "food101",
            "Food-101",
            {"train": Split(75_750, 101), "test": Split(25_250, 101)},
            "Bossard et al. 2014: 750 train and 250 test images per class (meta/train.txt, test.txt)",
            layouts=("food-101", *GENERIC),
            levels=_levels("diffclip1", "dive3"),
        ),
        _classification(
            "dtd",
            "Describable Textures (DTD, split 1)",
            {"train": Split(1_880, 47), "validation": Split(1_880, 47), "test": Split(1_880, 47)},
            "Cimpoi et al. 2014: 40 images per class in each of train / val / test (labels/*1.txt)",
            layouts=("dtd", *GENERIC),
            aliases={"val": "validation"},
            levels=_levels("dcr2", "dcr6", "diffclip1", "dive3"),
        ),
        _classification(
            "pets",
            "Oxford-IIIT Pets",
            {"train": Split(3_680, 37), "test": Split(3_669, 37)},
            "Parkhi et al. 2012: trainval 3,680, test 3,669 images, 37 breeds (annotations/trainval.txt, "
            "test.txt)",
            layouts=("oxford-pets", *GENERIC),
            templates="oxford_pets",
            aliases={"trainval": "train"},
            levels=_levels("diffclip1", "dive3"),
        ),
        _classification(
            "flowers",
            "Oxford Flowers-102",
            {"train": Split(1_020, 102), "validation": Split(1_020, 102), "test": Split(6_149, 102)},
            "Nilsback & Zisserman 2008: 10 train and 10 val images per class, 6,149 test (setid.mat's trnid, "
            "valid, tstid)",
            layouts=("flowers102", *GENERIC),
            templates="flowers102",
            aliases={"val": "validation"},
            levels=_levels("diffclip1", "dive3"),
        ),
        _classification(
            "caltech101",
            "Caltech-101",
            {"train": Split(3_060, 102), "test": Split(6_084, 102)},
            "Fei-Fei et al. 2004: 9,144 images in 101 classes + background (BACKGROUND_Google); no published "
            "split: 30 images a class for train, the rest test, as tfds draws it (the CLIP paper's Table 9, "
            "LGSSL), 3,060 / 6,084",
            layouts=("caltech101", *GENERIC),
            levels=_levels("dcr2", "dcr6", "diffclip1", "dive3"),
        ),
        _classification(
            "sun397",
            "SUN397",
            {"train": Split(19_850, 397), "test": Split(19_850, 397)},
            "Xiao et al. 2010: 108,754 images, 397 classes; the first of the publisher's ten partitions "
            "(Training_01.txt / Testing_01.txt: 50 + 50 images a class), the CLIP paper's split",
            layouts=("sun397", *GENERIC),
            levels=_levels("diffclip1", "dive3"),
        ),
        _classification(
            "eurosat",
            "EuroSAT (RGB)",
            {"train": Split(None, 10), "test": Split(27_000, 10)},
            "Helber et al. 2019: 27,000 images, 10 classes; no published split: the whole set is the test "
            "set, as clip_benchmark's torchvision `eurosat` reads it (its benchmark lists and Hub mirror, "
            "wds_vtab-eurosat, score VTAB's 5,400 test images instead); a train split is yours: not counted",
            layouts=("eurosat", *GENERIC),
            levels=_levels("dcr2", "dcr6", "dive3"),
        ),
        _classification(
            "ucf101",
            "UCF-101 (middle frames)",
            {"train": Split(9_537, 101), "test": Split(3_783, 101)},
            "Soomro et al. 2012: 13,320 clips, 101 action classes; split 1 of ucfTrainTestlist (trainlist01, "
            "testlist01: 9,537 / 3,783 clips), each clip's middle frame as the CLIP paper scores it",
            layouts=("ucf101", *GENERIC),
            levels=_levels("dive3"),
        ),
        _retrieval(
            "flickr30k",
            "Flickr30k (Karpathy test)",
            Split(1_000, None, 5_000),
            "Karpathy & Fei-Fei 2015 split",
        ),
        _retrieval(
            "flickr8k", "Flickr8k (Karpathy test)", Split(1_000, None, 5_000), "Karpathy & Fei-Fei 2015 split"
        ),
        _retrieval(
            "mscoco",
            "MSCOCO (Karpathy 5k test)",
            Split(5_000, None, 25_010),
            "Karpathy & Fei-Fei 2015 split: 5,000 val2014 images, 25,010 captions",
        ),
        Benchmark(
            "mmvp_vlm",
            "MMVP-VLM",
            "pairs",
            ("mmvp",),
            {"test": Split(135, 9)},
            "Tong et al. 2024 (tsb0601/MMVP README, scripts/evaluate_vlm.py): 9 patterns x 15 pairs",
            class_names_source="the nine visual patterns of the official evaluate_vlm.py, by pair position",
        ),
        Benchmark(
            "fmow",
            "FMoW (WILDS v1.1)",
            "classification",
            ("wilds-fmow",),
            {
                "train": Split(76_863),
                "id_val": Split(11_483),
                "id_test": Split(11_327),
                "val": Split(19_915),
                "test": Split(22_108),
            },
            "Koh et al. 2021 (WILDS), FMoW-wilds: 62 classes; OOD val 2013-2015, OOD test from 2016",
            class_names=FMOW_CATEGORIES,
            class_names_source="WILDS' 62 categories, as FLYP prompts them (underscores kept)",
            templates="fmow",
            templates_source="FLYP's src/templates/fmow_template.py (the 14 filled verbatim)",
            levels={"DiVE Table 4 (FMoW)": "category (62); OOD worst-region accuracy, 'Other' left out"},
        ),
        Benchmark(
            "iwildcam",
            "iWildCam (WILDS v2.0)",
            "classification",
            ("wilds-iwildcam",),
            {
                "train": Split(129_809),
                "id_val": Split(7_314),
                "id_test": Split(8_154),
                "val": Split(14_961),
                "test": Split(42_791),
            },
            "Koh et al. 2021 (WILDS), iWildCam2020-wilds: 182 classes",
            class_names=IWILDCAM_LABELS,
            class_names_source="labels by WILDS' scientific names; prompts with FLYP's english names "
            "(iwildcam_metadata/labels.csv, lower-cased)",
            prompt_names=IWILDCAM_CLASSNAMES,
            templates="iwildcam",
            templates_source="FLYP's src/templates/iwildcam_template.py",
            levels={"DiVE Table 4 (iWildCam)": "species (182), macro F1"},
        ),
        Benchmark(
            "cc3m",
            "Conceptual Captions 3M (img2dataset)",
            "image-text",
            ("img2dataset",),
            {"train": Split(None)},
            "Sharma et al. 2018; what img2dataset downloads varies (its _stats.json records it): not counted",
        ),
    )
}


# -- the benchmarks' copies on the Hub ---------------------------------------------------------------------

CLIP_BENCHMARK_LAYOUT = "clip-benchmark-wds"
FINE_LEVELS = {"aircraft": "variant", "cars": "model"}  # the class level zero-shot, probes and tables score
UNVERIFIED = (
    "not counted on the mirror itself (its file listing gives shard counts, not images): the publisher's "
    "split as clip_benchmark's builder exports it"
)


def _cb(
    name: str, test: Split, source: str = UNVERIFIED, *, train: Split | None = None, differs: str = "", **kw
) -> HubMirror:
    """A clip_benchmark mirror `clip-benchmark/wds_<name>` (its `test` split, and `train` where counted)."""
    splits = {"test": test} | ({"train": train} if train else {})
    return HubMirror(
        f"clip-benchmark/wds_{name}", CLIP_BENCHMARK_LAYOUT, splits, source, differs=differs, **kw
    )


_VAL_IS_TEST = {"split_names": {"validation": "test"}}  # clip_benchmark exports ImageNet's validation as test
MIRRORS: dict[str, tuple[HubMirror, ...]] = {
    "imagenet": (
        _cb("imagenet1k", Split(50_000, 1000), **_VAL_IS_TEST),
        HubMirror(
            "ILSVRC/imagenet-1k",
            "hf",
            {"train": Split(1_281_167, 1000), "validation": Split(50_000, 1000)},
            "the publisher's splits (parquet, a ClassLabel; gated: accept its terms, huggingface-cli login)",
        ),
        HubMirror(
            "timm/imagenet-1k-wds",
            "timm-wds",
            {"train": Split(1_281_167, 1000), "validation": Split(50_000, 1000)},
            "ILSVRC-2012's splits, which its card says it holds (not counted on the mirror itself)",
        ),
    ),
    "imagenet-v2": (_cb("imagenetv2", Split(10_000, 1000)),),
    "imagenet-r": (_cb("imagenet-r", Split(30_000, 200)),),
    "imagenet-a": (_cb("imagenet-a", Split(7_500, 200)),),
    "imagenet-sketch": (_cb("imagenet_sketch", Split(50_889, 1000)),),
    "objectnet": (
        _cb(
            "objectnet",
            Split(18_574, 113),
            differs="clip_benchmark's ObjectNet: its 113 class names scored as classes, not FLYP / WiSE-FT's "
            "maximum over each folder's ImageNet classes",
        ),
    ),
    "cars": (_cb("cars", Split(8_041, 196)),),
    "aircraft": (_cb("fgvc_aircraft", Split(3_333, 100)),),
    "food101": (_cb("food101", Split(25_250, 101)),),
    "sun397": (
        _cb(
            "sun397",
            Split(None, 397),
            "not counted: clip_benchmark's SUN397 split is its own (its size could not be verified)",
            differs="clip_benchmark's SUN397 split, not the CLIP paper's first partition (19,850 test)",
        ),
    ),
    "caltech101": (_cb("vtab-caltech101", Split(6_084, 102)),),
    "cifar10": (_cb("vtab-cifar10", Split(10_000, 10)),),
    "mnist": (_cb("mnist", Split(10_000, 10)),),
    "cifar100": (_cb("vtab-cifar100", Split(10_000, 100)),),
    "dtd": (_cb("vtab-dtd", Split(1_880, 47)),),
    "flowers": (_cb("vtab-flowers", Split(6_149, 102)),),
    "pets": (_cb("vtab-pets", Split(3_669, 37)),),
    "eurosat": (
        _cb(
            "vtab-eurosat",
            Split(5_400, 10),
            "the mirror's dataset viewer: 16,200 train and 5,400 test rows (VTAB's tfds split of EuroSAT)",
            train=Split(16_200, 10),
            differs="VTAB's EuroSAT: 5,400 test images (tfds' split), not the whole 27,000 that "
            "eurosat:<folder> scores",
        ),
    ),
    "flickr30k": (
        _cb(
            "flickr30k",
            Split(1_000, None, 5_000),
            "Karpathy's test split as clip_benchmark exports it (viewer: 1k test rows), 5 captions an image",
        ),
    ),
    "flickr8k": (_cb("flickr8k", Split(1_000, None, 5_000)),),
    "mscoco": (_cb("mscoco_captions", Split(5_000, None, 25_010)),),
    "mmvp_vlm": (
        HubMirror(
            "MMVP/MMVP_VLM",
            "mmvp",
            {"test": Split(135, 9)},
            "the official layout on the Hub (Questions.csv and 'MLLM_VLM Images/', 270 images), as published",
        ),
    ),
    "cub": (
        HubMirror(
            "efekankavalci/CUB_200_2011",
            "hf",
            {"train": Split(5_994, 200), "test": Split(5_794, 200)},
            "not counted on the copy itself: the publisher's official split, which its data/train-*.parquet "
            "and data/test-*.parquet are named after (a ClassLabel of the 200 species assumed, not verified)",
        ),
    ),
    "cc3m": (
        HubMirror(
            "pixparse/cc3m-wds",
            "webdataset",
            {"train": Split(None), "validation": Split(None)},
            "not counted: cc3m-train-*.tar and cc3m-validation-*.tar shards in one folder",
        ),
    ),
}


def _with_mirrors(benchmark: Benchmark) -> Benchmark:
    """`benchmark` with its Hub mirrors, and the shard layouts they are in (clip_benchmark's, timm's) among
    its layouts."""
    mirrors = MIRRORS.get(benchmark.key, ())
    layouts = benchmark.layouts
    layouts += tuple(m.layout for m in mirrors if m.layout in (CLIP_BENCHMARK_LAYOUT, "timm-wds"))
    return replace(benchmark, mirrors=mirrors, layouts=layouts)


BENCHMARKS: dict[str, Benchmark] = {key: _with_mirrors(b) for key, b in _PUBLISHED.items()}


def benchmark_of_repo(repo_id: str) -> Benchmark | None:
    """The benchmark whose registered Hub mirror is `repo_id` (exactly), None for any other repo."""
    return next((b for b in BENCHMARKS.values() if b.mirror(repo_id=repo_id)), None)


def benchmark_of(name: str | None) -> Benchmark | None:
    """The benchmark a registry name stands for: its `<key>:` prefix (or another spelling of a key), or a
    registered Hub mirror (`hf:clip-benchmark/wds_cars`); None for a user's own data, whatever a path in it
    is named ("imagefolder:/data/imagenet-r", "hf:uoft-cs/cifar10")."""
    if not name:
        return None
    prefix = name.partition(":")[0]
    if prefix in BENCHMARKS:
        return BENCHMARKS[prefix]
    if is_hub_spec(name):
        return benchmark_of_repo(parse_hub_spec(name).repo_id)
    table = {_normalise(key): key for key in BENCHMARKS} | {
        _normalise(b.title): k for k, b in BENCHMARKS.items()
    }
    table |= {_normalise(alias): key for alias, key in _KEY_ALIASES.items()}
    key = _named_in(name, table)
    return BENCHMARKS.get(key) if key else None


def openai_class_names(dataset_name: str | None, names: list[str] | None) -> list[str] | None:
    """The names prompts use for a dataset's labels `names` (OpenAI's curated ImageNet names, or those a
    benchmark of `hf_vrl.data.benchmarks` prompts with), or None to keep `names`.

    The default of every ImageNet-family set (`imagenet_family`) and of any set whose classes are ImageNet
    WordNet ids (image folders of ImageNet, -Sketch, -R, -A): wnids map to their names; 1000 labels (or 200
    for ImageNet-R / -A) in the standard order, or ImageNet-V2's folders "0".."999", map by position. A
    benchmark whose labels are named otherwise than it is prompted (iWildCam: scientific names, prompted with
    FLYP's English ones) maps to its prompt names."""
    if not names:
        return None
    index = {wnid: i for i, wnid in enumerate(IMAGENET_WNIDS)}
    if all(name in index for name in names):
        return [IMAGENET_CLASSNAMES[index[name]] for name in names]
    benchmark = benchmark_of(dataset_name)
    if benchmark is not None and benchmark.prompt_names and list(names) == list(benchmark.class_names or ()):
        return list(benchmark.prompt_names)
    member = imagenet_family(dataset_name)
    if member is None or member == "objectnet":  # ObjectNet's 113 classes come with their own mapping
        return None
    if all(name.isdigit() for name in names) and all(int(name) < 1000 for name in names):
        return [IMAGENET_CLASSNAMES[int(name)] for name in names]
    if len(names) == len(imagenet_class_wnids(member)):
        return imagenet_class_names(member)
    if len(names) == 1000:
        return list(IMAGENET_CLASSNAMES)
    return None


def benchmark_name(name: str | None) -> str | None:
    """The key of the benchmark `name` stands for (`benchmark_of`: its key, a registered Hub mirror such as
    `hf:ILSVRC/imagenet-1k`), by which its templates and class names are found; else `name` itself."""
    benchmark = benchmark_of(name)
    return benchmark.key if benchmark else name


# other spellings of the keys (compared after normalisation), as the template sets and folders name them
_KEY_ALIASES = {
    "imagenet1k": "imagenet",
    "ilsvrc2012": "imagenet",
    "imagenetv2matchedfrequency": "imagenet-v2",
    "imagenetrendition": "imagenet-r",
    "imagenetadversarial": "imagenet-a",
    "fgvcaircraft": "aircraft",
    "fgvcaircraft2013b": "aircraft",
    "stanfordcars": "cars",
    "oxfordpets": "pets",
    "oxfordiiitpet": "pets",
    "flowers102": "flowers",
    "oxfordflowers102": "flowers",
    "cub200": "cub",
    "cub2002011": "cub",
    "coco": "mscoco",
    "mmvp": "mmvp_vlm",
    "fmowv11": "fmow",
    "iwildcamv20": "iwildcam",
    "cifar10batchespy": "cifar10",
    "cifar100python": "cifar100",
    "101objectcategories": "caltech101",
    "eurosatrgb": "eurosat",
}


@dataclass(frozen=True)
class Counts:
    """What a loaded split holds against its official counts (`complete` when nothing is missing or extra);
    for a Hub mirror, against the mirror's own counts, with the mirror named (`source`)."""

    benchmark: str
    split: str
    images: int
    official_images: int | None
    classes: int | None = None
    official_classes: int | None = None
    texts: int | None = None
    official_texts: int | None = None
    missing_classes: tuple[str, ...] = ()
    source: str | None = None  # a Hub mirror's repo and where its counts come from, when the data are one
    differs: str | None = None  # where scoring that mirror differs from the registry's reading

    @property
    def complete(self) -> bool:
        pairs = ((self.images, self.official_images), (self.classes, self.official_classes))
        pairs += ((self.texts, self.official_texts),)
        return all(official is None or have == official for have, official in pairs)

    def describe(self) -> str:
        """E.g. "120 of 30,000 images, 5 of 200 classes" (the counts that have official numbers)."""
        unit = "pairs" if self.benchmark == "mmvp_vlm" else "images"
        parts = [_of(self.images, self.official_images, unit)]
        if self.official_classes is not None and self.classes is not None:
            parts.append(
                _of(self.classes, self.official_classes, "categories" if unit == "pairs" else "classes")
            )
        if self.official_texts is not None and self.texts is not None:
            parts.append(_of(self.texts, self.official_texts, "captions"))
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """The record a report keeps beside the numbers."""
        record = {k: v for k, v in vars(self).items() if v is not None and k != "missing_classes"}
        if self.missing_classes:
            record["missing_classes"] = list(self.missing_classes)
        return {**record, "complete": self.complete, "described": self.describe()}


def _of(have: int, official: int | None, unit: str) -> str:
    return f"{have:,} {unit}" if official is None else f"{have:,} of {official:,} {unit}"


def check_counts(counts: Counts, where: str, *, allow_partial: bool = False) -> Counts:
    """`counts` when complete (or when `allow_partial`); else a one-line UserError naming what is missing."""
    if counts.complete or allow_partial:
        return counts
    missing = ""
    if counts.missing_classes:
        shown = ", ".join(counts.missing_classes[:5])
        more = len(counts.missing_classes) - 5
        missing = f" (missing {shown}{f' and {more} more' if more > 0 else ''})"
    raise UserError(
        f"{BENCHMARKS[counts.benchmark].title} {counts.split} at {where}: {counts.describe()}{missing}; give "
        "the whole set, or pass --allow-partial to score it marked as partial"
    )
