"""The run tests reuse the data tests' writers of real shards and tables."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "data"))
