"""transformers' own common model tests (`ModelTesterMixin`, tests/test_modeling_common.py) of the installed
release, which its wheel does not ship: taken unchanged from the release's source distribution on the package
index and built once into a package under COMPAT_CACHE (slow tests only).

`test_modeling_common.py` imports two mixins from sub-packages the source distribution lacks
(`exporters.test_export.ExportTesterMixin`, a base of `ModelTesterMixin` holding the `torch.export` tests, and
`generation.test_utils.GenerationTesterMixin`, for models that generate); they are written as empty classes,
so the harness runs every common test but those of `torch.export`, the same for hf_vrl's models and their
transformers baselines. `parameterized`, its one test-only dependency, is installed beside it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from remote_code import COMPAT_CACHE

PACKAGE = "transformers_common_tests"
STAND_INS = {
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
}


def _pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"pip {args[0]} failed: {done.stderr[-2000:]}")


def common_tests_path(version: str) -> Path:
    """A folder to put on sys.path: `transformers_common_tests.test_modeling_common` is transformers' file of
    release `version`, with the stand-ins above and `parameterized`. Built once, atomically, and reused."""
    target = COMPAT_CACHE / f"common-tests-{version}"
    if (target / PACKAGE / "test_modeling_common.py").is_file():
        return target
    COMPAT_CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"common-tests-{version}-", dir=COMPAT_CACHE))
    try:
        _pip("download", f"transformers=={version}", "--no-binary", ":all:", "--no-deps", "-d", str(staging))
        _pip("install", "--no-deps", "--target", str(staging), "parameterized")
        (archive,) = staging.glob("transformers-*.tar.gz")
        with tarfile.open(archive) as sdist:
            source = sdist.extractfile(f"transformers-{version}/tests/test_modeling_common.py").read()
        package = staging / PACKAGE
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "test_modeling_common.py").write_bytes(source)
        for name, text in STAND_INS.items():
            (package / name).parent.mkdir(exist_ok=True)
            (package / name).parent.joinpath("__init__.py").write_text("")
            (package / name).write_text(text)
        archive.unlink()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        staging.rename(target)  # atomic: a concurrent build that finished first wins
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target
