"""Every hf_vrl model class fails no more of transformers' own common model tests (`ModelTesterMixin` of the
installed release) than its transformers baseline under the same harness: DiffCLIP's five classes against
CLIP's, DCRModel against CLIPVisionModelWithProjection, CLUEModel against ResNetModel / ViTModel with that
backbone (common_harness.py).

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

HARNESS = Path(__file__).with_name("common_harness.py")
PAIRS = """
import json
from common_harness import PAIRS
names = {n: [o.__name__, b.__name__, b.all_model_classes[0].__name__] for n, (o, b) in PAIRS.items()}
print(json.dumps(names))
"""


def run_child(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """`command` from the repository root, with transformers' common tests and the harness importable."""
    path = os.pathsep.join([str(common_tests_path(transformers.__version__)), str(HARNESS.parent)])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        command, cwd=HARNESS.parents[2], env=env, capture_output=True, text=True, timeout=3000
    )
    assert done.returncode == 0 or not check, done.stderr[-3000:]
    return done


def outcomes(junit: Path) -> dict[str, dict[str, str]]:
    """{test case class: {test: "passed" | "failed" | "skipped"}}; a test with a failing subtest failed."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for case in ET.parse(junit).getroot().iter("testcase"):
        tests = found[case.get("classname").rsplit(".", 1)[-1]]
        kinds = {child.tag for child in case}
        state = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        if tests.get(case.get("name")) != "failed":
            tests[case.get("name")] = state
    return found


def failures(tests: dict[str, str]) -> set[str]:
    return {name for name, state in tests.items() if state == "failed"}


@pytest.mark.slow
def test_every_model_class_fails_no_more_common_tests_than_its_baseline(tmp_path):
    pairs = json.loads(run_child([sys.executable, "-c", PAIRS]).stdout.strip().splitlines()[-1])
    junit = tmp_path / "common.xml"
    command = [sys.executable, "-m", "pytest", str(HARNESS), "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    done = run_child(command + ["-o", "addopts=", "-W", "ignore", f"--junitxml={junit}"], check=False)
    assert junit.is_file(), done.stdout[-3000:]
    found = outcomes(junit)
    rows, worse = [], []
    for name, (ours, baseline, baseline_class) in pairs.items():
        ours_tests, base_tests = found[ours], found[baseline]
        assert len(ours_tests) > 100 and len(base_tests) > 100, name  # the harness ran
        mine, theirs = failures(ours_tests), failures(base_tests)
        rows.append(f"{name}: {len(mine)} of {len(ours_tests)} failed ({baseline_class}: {len(theirs)})")
        if len(mine) > len(theirs):
            worse.append(f"{name}: fails {sorted(mine - theirs)} beyond its baseline")
    print("\n".join(rows))
    assert not worse, "\n".join(worse)
