"""Named presets shipped in `hub_configs/` (JSON recipes and the tiny-clip model directory)."""

from __future__ import annotations

import json
from pathlib import Path

HUB_CONFIGS = Path(__file__).parent / "hub_configs"


def preset_path(name_or_path: str | Path) -> Path:
    """Resolve an existing path, or a preset name (``"dcr-tiny"``, ``"tiny-clip"``) in ``hub_configs/``."""
    path = Path(name_or_path)
    if path.exists():
        return path
    for candidate in (HUB_CONFIGS / str(name_or_path), HUB_CONFIGS / f"{name_or_path}.json"):
        if candidate.exists():
            return candidate
    known = sorted(p.stem for p in HUB_CONFIGS.iterdir() if not p.name.startswith(("_", ".")))
    raise FileNotFoundError(f"no file or preset named {str(name_or_path)!r}; presets: {', '.join(known)}")


def load_preset(name_or_path: str | Path) -> dict:
    """Load a JSON preset by name or path."""
    return json.loads(preset_path(name_or_path).read_text())


def list_presets() -> list[tuple[str, str, str]]:
    """(name, method, first sentence of the description) of every JSON preset in hub_configs/."""
    out = []
    for path in sorted(HUB_CONFIGS.glob("*.json")):
        preset = json.loads(path.read_text())
        first = str(preset.get("description", "")).split(". ")[0].rstrip(".")
        out.append((path.stem, str(preset.get("method", "")), first))
    return out
