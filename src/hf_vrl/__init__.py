"""hf_vrl: Hugging Face-native visual representation learning (DiffCLIP, DCR, DiVE, CLUE).

Importing the package is cheap; heavy modules load on first use.
"""

__version__ = "0.1.0"


def train(method: str, config=None, **overrides):
    """Train `method` ("diffclip", "dcr", ...) as `hf-vrl train` does and return the report; see
    `hf_vrl.run.train`."""
    from hf_vrl.run import train as _train

    return _train(method, config, **overrides)
