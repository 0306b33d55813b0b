"""The model tests reuse the method tests' tiny backbone configs (tests/methods/clue_helpers.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "methods"))
