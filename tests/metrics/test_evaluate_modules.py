"""The paper metrics as `evaluate` modules: each loads offline by path (from a module cache of its own) and
computes what `hf_vrl.metrics` computes, in one call or batch by batch, and they combine. Each folder stands
alone, as a Hub Space: copied elsewhere it loads and computes the same numbers where neither hf_vrl nor torch
can be imported, and it carries a metric card, a requirements.txt naming what it imports, and an app.py."""

from __future__ import annotations

import ast
import configparser
import doctest
import fnmatch
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch

from hf_vrl import metrics
from hf_vrl.errors import UserError


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    """`evaluate.load` of an hf_vrl module, evaluate's module and results caches in a temporary folder."""
    root = tmp_path_factory.mktemp("evaluate")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate.config, "HF_MODULES_CACHE", root / "modules")
        # evaluate imports modules as `evaluate_modules.metrics.<name>.<hash>` from the cache's package, after
        # appending the cache to sys.path; the default cache (~/.cache/huggingface/modules, which `datasets`
        # puts on sys.path too) or one of this fixture's earlier set-ups would shadow it: this cache comes
        # first, and no earlier `evaluate_modules` stays imported
        patch.setattr(sys, "path", [str(root / "modules"), *sys.path])
        for name in [m for m in sys.modules if m.split(".")[0] == "evaluate_modules"]:
            patch.delitem(sys.modules, name)
        importlib.invalidate_caches()
        yield lambda name: metrics.evaluate_module(name, cache_dir=str(root / "results"))


@pytest.fixture(scope="module")
def blobs():
    """Embeddings of 4 fine classes in 2 coarse classes, 15 samples each, around well separated centres."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 8)) * 4
    fine = np.repeat(np.arange(4), 15)
    return (centres[fine] + rng.normal(size=(60, 8))).astype(np.float32), fine, fine // 2


def test_every_module_is_shipped_and_named(load):
    assert set(metrics.EVALUATE_MODULES) == {"clustering", "granularity", "mmvp", "rsa"}
    for name in metrics.EVALUATE_MODULES:
        module = load(name)
        assert isinstance(module, evaluate.EvaluationModule)
        assert module.name == name and module.description.strip() and module.citation.strip()


def test_evaluate_load_by_path_is_the_same_module(load, blobs, tmp_path):
    x, fine, _ = blobs
    by_path = evaluate.load(metrics.evaluate_module_path("clustering"), cache_dir=str(tmp_path))
    assert by_path.compute(predictions=x, references=fine) == load("clustering").compute(
        predictions=x, references=fine
    )


def test_clustering(load, blobs):
    x, fine, _ = blobs
    clustering = load("clustering")
    assert clustering.compute(predictions=x, references=fine) == metrics.clustering_scores(x, fine)
    for start in range(0, 60, 20):  # batch by batch, tensors in
        clustering.add_batch(
            predictions=torch.from_numpy(x[start : start + 20]), references=fine[start : start + 20]
        )
    assert clustering.compute(seed=3, n_clusters=2) == metrics.clustering_scores(
        x, fine, n_clusters=2, seed=3
    )


def test_granularity(load, blobs):
    x, fine, coarse = blobs
    granularity = load("granularity")
    assert granularity.compute(
        predictions=x, references=fine, coarse_labels=coarse
    ) == metrics.granularity_scores(x, fine, coarse)
    plain = granularity.compute(predictions=x, references=fine)
    assert plain == {"cdnv_all": metrics.cdnv(x, fine), "ncc_fine": metrics.ncc_accuracy(x, fine)}
    assert plain["ncc_fine"] == 1.0  # well separated blobs: a check that the numbers mean something


def test_rsa(load, blobs):
    x, _, _ = blobs
    rotated = x @ np.linalg.qr(np.random.default_rng(1).normal(size=(8, 8)))[0]
    noisy = x + np.random.default_rng(2).normal(size=x.shape) * 3
    rsa = load("rsa")
    assert rsa.compute(predictions=rotated, references=x)["rsa"] == pytest.approx(1.0)  # geometry kept
    assert rsa.compute(predictions=noisy, references=x) == {"rsa": metrics.rsa_score(x, noisy)}
    assert metrics.rsa_score(x, noisy) < 0.95


def test_mmvp(load):
    logits = np.random.default_rng(0).normal(size=(12, 2, 2))
    categories = ["colour", "count", "size"] * 4
    mmvp = load("mmvp")
    assert mmvp.compute(predictions=logits, categories=categories) == metrics.mmvp_score(logits, categories)
    mmvp.add_batch(predictions=logits[:5])
    mmvp.add_batch(predictions=logits[5:])
    assert mmvp.compute() == metrics.mmvp_score(logits)


def test_modules_combine(load, blobs):
    x, fine, _ = blobs
    combined = evaluate.combine([load("clustering"), load("granularity")])
    result = combined.compute(predictions=x, references=fine)
    assert result == {
        **metrics.clustering_scores(x, fine),
        "cdnv_all": metrics.cdnv(x, fine),
        "ncc_fine": 1.0,
    }


@pytest.mark.parametrize(
    "name, functions",
    [
        ("clustering", ("cluster_accuracy", "clustering_scores")),
        ("granularity", ("cdnv", "granularity_scores", "ncc_accuracy")),
        ("rsa", ("rsa_score",)),
    ],
)
def test_hf_vrl_metrics_and_the_module_share_one_copy(name, functions):
    """hf_vrl.metrics' functions are those of the module folder's `scores.py` (plain numpy, no hf_vrl), and
    the module file computes nothing of its own: it calls them."""
    for function in functions:
        assert getattr(metrics, function).__module__ == f"hf_vrl.metrics.evaluate_modules.{name}.scores"
    module = ast.parse((MODULES_DIR / name / f"{name}.py").read_text())
    assert not [node.name for node in module.body if isinstance(node, ast.FunctionDef)]
    assert not _top_level_imports(MODULES_DIR / name / "scores.py") & {"hf_vrl", "torch", "evaluate"}


def test_an_unknown_module_names_those_that_exist():
    with pytest.raises(
        UserError, match="no evaluate module named 'accuracy'; choose one of: clustering, granularity"
    ):
        metrics.evaluate_module("accuracy")
    with pytest.raises(UserError, match="no evaluate module named"):
        metrics.evaluate_module_path("../rsa")


MODULES_DIR = Path(metrics.evaluate_module_path("clustering")).parent

# Run in a fresh interpreter where hf_vrl and torch cannot be imported (a finder wrapping all others answers
# "not found" for them, to `import`, `importlib.util.find_spec` and `importlib.metadata`, as for packages that
# are not installed): load each copied module folder by path and print its results as JSON.
_STANDALONE = """
import json, sys

class NotInstalled:
    def __init__(self, finders, names):
        self.finders, self.names = finders, names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            return None
        for finder in self.finders:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                return spec

    def find_distributions(self, context=None):
        import importlib.metadata

        context = context or importlib.metadata.DistributionFinder.Context()
        if (context.name or "").lower().replace("-", "_") in self.names:
            return []
        finders = [f for f in self.finders if hasattr(f, "find_distributions")]
        return [distribution for f in finders for distribution in f.find_distributions(context)]

sys.meta_path[:] = [NotInstalled(list(sys.meta_path), {"hf_vrl", "torch"})]
import evaluate

root, cache = sys.argv[1], sys.argv[2]
inputs = json.load(open(root + "/inputs.json"))
x, fine, coarse, noisy = inputs["x"], inputs["fine"], inputs["coarse"], inputs["noisy"]
logits, categories = inputs["logits"], inputs["categories"]
clustering, granularity, mmvp, rsa = (
    evaluate.load(root + "/" + name, cache_dir=cache) for name in ("clustering", "granularity", "mmvp", "rsa")
)
out = {"clustering": clustering.compute(predictions=x, references=fine)}
for start in range(0, len(x), 20):
    clustering.add_batch(predictions=x[start : start + 20], references=fine[start : start + 20])
out["clustering_kwargs"] = clustering.compute(seed=3, n_clusters=2)
out["granularity"] = granularity.compute(predictions=x, references=fine, coarse_labels=coarse)
out["granularity_plain"] = granularity.compute(predictions=x, references=fine)
out["mmvp"] = mmvp.compute(predictions=logits, categories=categories)
out["mmvp_plain"] = mmvp.compute(predictions=logits)
out["rsa"] = rsa.compute(predictions=noisy, references=x)
try:
    import hf_vrl  # noqa: F401
    blocked = False
except ImportError:
    blocked = True
loaded = [m for m in sys.modules if m.split(".")[0] in ("hf_vrl", "torch")]
files = sorted(sys.modules[type(m).__module__].__file__ for m in (clustering, granularity, mmvp, rsa))
print(json.dumps({"results": out, "blocked": blocked, "loaded": loaded, "files": files}))
"""


def test_each_module_folder_stands_alone_without_hf_vrl(blobs, tmp_path):
    """Copied out of hf_vrl, each folder loads offline in an interpreter that cannot import hf_vrl or torch,
    from a module cache of its own, and computes exactly what hf_vrl.metrics computes here."""
    x, fine, coarse = blobs
    noisy = x + np.random.default_rng(2).normal(size=x.shape).astype(np.float32) * 3
    logits = np.random.default_rng(0).normal(size=(12, 2, 2))
    categories = ["colour", "count", "size"] * 4
    root = tmp_path / "spaces"
    for name in metrics.EVALUATE_MODULES:
        shutil.copytree(MODULES_DIR / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    inputs = {
        "x": x,
        "fine": fine,
        "coarse": coarse,
        "noisy": noisy,
        "logits": logits,
        "categories": categories,
    }
    (root / "inputs.json").write_text(json.dumps({k: np.asarray(v).tolist() for k, v in inputs.items()}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PYTHON"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_MODULES_CACHE=str(tmp_path / "modules"))
    env.update(HF_DATASETS_DISABLE_PROGRESS_BARS="1", OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-c", _STANDALONE, str(root), str(tmp_path / "results")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    child = json.loads(run.stdout.strip().splitlines()[-1])
    assert child["blocked"] and child["loaded"] == []
    assert all(Path(f).is_relative_to(tmp_path / "modules") for f in child["files"]), child["files"]
    got = child["results"]
    assert got["clustering"] == metrics.clustering_scores(x, fine)
    assert got["clustering_kwargs"] == metrics.clustering_scores(x, fine, n_clusters=2, seed=3)
    assert got["granularity"] == metrics.granularity_scores(x, fine, coarse)
    assert got["granularity_plain"] == {
        "cdnv_all": metrics.cdnv(x, fine),
        "ncc_fine": metrics.ncc_accuracy(x, fine),
    }
    assert got["mmvp"] == metrics.mmvp_score(logits, categories)
    assert got["mmvp_plain"] == metrics.mmvp_score(logits)
    assert got["rsa"] == {"rsa": metrics.rsa_score(x, noisy)}


SPACE_KEYS = {
    "title",
    "emoji",
    "colorFrom",
    "colorTo",
    "sdk",
    "sdk_version",
    "app_file",
    "pinned",
    "tags",
    "description",
}
CARD_SECTIONS = (
    "Metric Description",
    "How to Use",
    "Inputs",
    "Output Values",
    "Examples",
    "Limitations and Bias",
    "Citation",
    "Further References",
)
DISTRIBUTIONS = {"sklearn": "scikit-learn"}  # import name -> the name pip installs it by, where they differ


def _top_level_imports(path: Path) -> set[str]:
    """The third-party packages `path` imports (anywhere in it); a relative import must name a file beside it,
    which `evaluate` copies along (a module of a subfolder or a parent it does not)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1 and (path.parent / f"{node.module}.py").is_file(), ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__"}


@pytest.mark.parametrize("name", metrics.EVALUATE_MODULES)
def test_each_module_folder_is_a_space(name):
    """What `evaluate-cli create` lays out: a metric card with the Space's YAML header and the card's
    sections, a requirements.txt naming every third-party import of the folder's files, an app.py running
    its widget."""
    from huggingface_hub import RepoCard

    folder = MODULES_DIR / name
    card = RepoCard.load(folder / "README.md")
    meta = card.data.to_dict()
    assert SPACE_KEYS <= meta.keys(), SPACE_KEYS - meta.keys()
    assert (meta["sdk"], meta["app_file"], meta["pinned"]) == ("gradio", "app.py", False)
    assert {"evaluate", "metric"} <= set(meta["tags"]) and meta["description"].strip()
    headings = re.findall(r"^#+ (.+?)\s*$", card.text, flags=re.M)
    assert headings[0] == f"Metric Card for {meta['title']}"
    assert [h for h in headings if h in CARD_SECTIONS] == list(CARD_SECTIONS)

    requirements = {
        re.split(r"[\s<>=!~;\[]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
        for line in (folder / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    imports = set().union(*(_top_level_imports(path) for path in folder.glob("*.py")))
    assert not imports & {"hf_vrl", "torch"}
    assert {DISTRIBUTIONS.get(i, i) for i in imports} <= requirements

    app = ast.parse((folder / "app.py").read_text())
    assert f"{name}.py" in {n.value for n in ast.walk(app) if isinstance(n, ast.Constant)}
    assert "launch_gradio_widget" in {n.id for n in ast.walk(app) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("name", metrics.EVALUATE_MODULES)
def test_the_examples_of_card_and_module_hold(name, load, monkeypatch, tmp_path):
    """The `>>>` examples of the metric card and of the module's docstring print what the module returns
    (their `evaluate.load("path/to/<name>")` loads the module shipped here)."""
    module = load(name)
    real_load = evaluate.load
    monkeypatch.setattr(
        evaluate,
        "load",
        lambda path: real_load(metrics.evaluate_module_path(Path(path).name), cache_dir=str(tmp_path)),
    )
    card = (MODULES_DIR / name / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", card, flags=re.S) + [
        textwrap.dedent(module.inputs_description.split("Examples:")[1])
    ]
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    examples = [e for block in blocks for e in parser.get_examples(block)]
    assert len(examples) >= 3
    test = doctest.DocTest(examples, {}, name, None, 0, None)
    assert runner.run(test, out=lambda s: pytest.fail(s)).failed == 0


def test_the_wheel_ships_every_file_of_the_module_folders():
    setup = configparser.ConfigParser()
    setup.read(Path(__file__).parents[2] / "setup.cfg")
    patterns = [p.strip() for p in setup["options.package_data"]["hf_vrl"].replace("\n", ",").split(",")]
    package = MODULES_DIR.parents[1]
    for name in metrics.EVALUATE_MODULES:
        files = [p for p in (MODULES_DIR / name).iterdir() if p.is_file()]
        assert {p.name for p in files} >= {f"{name}.py", "README.md", "requirements.txt", "app.py"}
        for path in files:
            relative = path.relative_to(package).as_posix()
            assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not in package_data"
