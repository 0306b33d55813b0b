"""No hf_vrl model class fails a test of transformers' own common model tests (`ModelTesterMixin` of the
installed release) that its transformers baseline passes under the same harness, compared by test name:
DiffCLIP's five classes against CLIP's, DCRModel against CLIPVisionModelWithProjection, CLUEModel against
ResNetModel / ViTModel with that backbone (common_harness.py). A pass that built no model of the class under
test (the harness's record) is "vacuous" and counts as no pass, for either member of a pair. The report lists,
per class, the tests its baseline passes and it fails (none), and those it does not run, by name.

Slow: the harness (about 1,700 tests) runs with pytest in a child process, from transformers' test file of
the installed release, fetched once from the package index (transformers_tests.py). It is imported in child
processes only: its markers are unknown to this project's pytest (--strict-markers). The fast tests of the
fixes it found are in test_model_contract.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest
import transformers
from transformers_tests import common_tests_path

import hf_vrl

HARNESS = Path(__file__).with_name("common_harness.py")
PAIRS = """
import json
from common_harness import PAIRS
names = {n: [o.__name__, b.__name__, b.all_model_classes[0].__name__] for n, (o, b) in PAIRS.items()}
print(json.dumps(names))
"""


def run_child(
    command: list[str], check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`command` from the repository root, with transformers' common tests, the harness and the hf_vrl this
    process imports importable."""
    tests = common_tests_path(transformers.__version__)
    path = os.pathsep.join(map(str, [tests, HARNESS.parent, Path(hf_vrl.__file__).parents[1]]))
    env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    done = subprocess.run(
        command, cwd=HARNESS.parents[2], env=env, capture_output=True, text=True, timeout=3000
    )
    assert done.returncode == 0 or not check, done.stderr[-3000:]
    return done


def built_models(record: Path) -> dict[tuple[str, str], bool]:
    """{(test case class, test): whether the test built a model of its class} (the harness's record)."""
    lines = record.read_text().splitlines() if record.is_file() else []
    return {(row["case"], row["test"]): row["built"] for row in map(json.loads, lines)}


def outcomes(junit: Path, built: dict[tuple[str, str], bool]) -> dict[str, dict[str, str]]:
    """{test case class: {test: "passed" | "vacuous" | "failed" | "skipped"}}: a test with a failing subtest
    failed; a pass that built no model of the class under test is vacuous."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name, test = case.get("classname").rsplit(".", 1)[-1], case.get("name")
        kinds = {child.tag for child in case}
        state = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        if state == "passed" and not built.get((name, test), True):
            state = "vacuous"
        if found[name].get(test) != "failed":
            found[name][test] = state
    return found


def having(tests: dict[str, str], state: str) -> set[str]:
    return {name for name, have in tests.items() if have == state}


def compare(
    name: str, ours: dict[str, str], base: dict[str, str], baseline: str
) -> tuple[list[str], list[str]]:
    """(report lines, the tests `baseline` passes and `name` fails) of one pair, by test name."""
    passes = having(base, "passed")
    regressed = sorted(passes & having(ours, "failed"))
    not_run = sorted(passes - having(ours, "passed") - having(ours, "failed"))
    counts = ", ".join(f"{len(having(ours, s))} {s}" for s in ("passed", "failed", "vacuous", "skipped"))
    base_counts = ", ".join(f"{len(having(base, s))} {s}" for s in ("passed", "failed", "vacuous", "skipped"))
    lines = [
        f"{name}: {counts} ({baseline}: {base_counts})",
        f"  {baseline} passes, {name} fails: {', '.join(regressed) or 'none'}",
        f"  {baseline} passes, {name} does not run: {', '.join(not_run) or 'none'}",
    ]
    return lines, regressed


@pytest.mark.slow
def test_no_model_class_fails_a_common_test_its_baseline_passes(tmp_path):
    pairs = json.loads(run_child([sys.executable, "-c", PAIRS]).stdout.strip().splitlines()[-1])
    junit, record = tmp_path / "common.xml", tmp_path / "built.jsonl"
    command = [sys.executable, "-m", "pytest", str(HARNESS), "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    command += ["-o", "addopts=", "-W", "ignore", f"--junitxml={junit}"]
    done = run_child(command, check=False, env={"HARNESS_RECORD": str(record)})
    assert junit.is_file(), done.stdout[-3000:]
    found = outcomes(junit, built_models(record))
    report, worse = [], []
    for name, (ours, baseline, baseline_class) in pairs.items():
        assert len(found[ours]) > 100 and len(found[baseline]) > 100, name  # the harness ran
        assert having(found[baseline], "passed"), name
        lines, regressed = compare(name, found[ours], found[baseline], baseline_class)
        report += lines
        worse += [f"{name} fails {test}, which {baseline_class} passes" for test in regressed]
        # the harness gives the baseline what transformers' own suite does: it fails none of the tests
        worse += [
            f"{baseline_class} fails {test} under the harness" for test in having(found[baseline], "failed")
        ]
    print("\n".join(report))
    assert not worse, "\n".join(report)
    for case in ("DiffCLIPModelTest", "CLIPModelTest"):  # the eager-vs-SDPA tests run, with CLIP's inputs
        assert any(t.startswith("test_eager_matches_sdpa") for t in having(found[case], "passed")), case


JUNIT = """<testsuites><testsuite>
<testcase classname="common_harness.OursTest" name="test_a"><failure message="x"/></testcase>
<testcase classname="common_harness.OursTest" name="test_b"/>
<testcase classname="common_harness.OursTest" name="test_training"/>
<testcase classname="common_harness.BaseTest" name="test_a"/>
<testcase classname="common_harness.BaseTest" name="test_b"><failure message="y"/></testcase>
<testcase classname="common_harness.BaseTest" name="test_training"/>
</testsuite></testsuites>"""


def test_the_comparison_is_by_test_name_and_a_pass_that_built_nothing_is_no_pass(tmp_path):
    """One failure each, but not the same test: ours fails test_a, which the baseline passes (a count would
    see no difference); test_training built no model on either side: vacuous, not a pass."""
    (tmp_path / "j.xml").write_text(JUNIT)
    rows = [{"case": case, "test": "test_training", "built": False} for case in ("OursTest", "BaseTest")]
    (tmp_path / "built.jsonl").write_text("\n".join(map(json.dumps, rows)))
    found = outcomes(tmp_path / "j.xml", built_models(tmp_path / "built.jsonl"))
    assert found["OursTest"] == {"test_a": "failed", "test_b": "passed", "test_training": "vacuous"}
    lines, regressed = compare("Ours", found["OursTest"], found["BaseTest"], "Base")
    assert regressed == ["test_a"]
    assert lines[1:] == ["  Base passes, Ours fails: test_a", "  Base passes, Ours does not run: none"]
    assert (
        lines[0]
        == "Ours: 1 passed, 1 failed, 1 vacuous, 0 skipped (Base: 1 passed, 1 failed, 1 vacuous, 0 skipped)"
    )
