"""hf_vrl: Hugging Face-native visual representation learning (DiffCLIP, DCR, DiVE, CLUE).

Importing the package is cheap; heavy modules load on first use.
"""

__version__ = "0.1.0"
