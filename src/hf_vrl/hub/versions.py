"""The transformers versions a published hf_vrl model supports, read from the package: the newest minimum
of the remote-code modules (`MINIMUM_TRANSFORMERS` in each model's configuration file, which refuses older
versions) up to the major version hf_vrl's own transformers requirement stops before."""

from __future__ import annotations

import sys

__all__ = ["remote_code_transformers"]


def remote_code_transformers() -> str:
    """A pip specifier, e.g. ">=4.57,<6"."""
    from hf_vrl.models.auto import AUTO_CONFIGS

    modules = {sys.modules[config.__module__] for config in AUTO_CONFIGS}
    minimum = max(getattr(module, "MINIMUM_TRANSFORMERS", (4, 0)) for module in modules)
    return f">={minimum[0]}.{minimum[1]},<{_major_bound()}"


def _major_bound() -> int:
    """The `<N` of hf_vrl's transformers requirement (installed metadata; else the next major version)."""
    from importlib.metadata import PackageNotFoundError, requires

    import transformers
    from packaging.requirements import Requirement

    try:
        requirements = [Requirement(r) for r in requires("hf-vrl") or []]
    except PackageNotFoundError:
        requirements = []
    for requirement in requirements:
        if requirement.name == "transformers":
            for spec in requirement.specifier:
                if spec.operator == "<":
                    return int(spec.version.split(".")[0])
    return int(transformers.__version__.split(".")[0]) + 1
