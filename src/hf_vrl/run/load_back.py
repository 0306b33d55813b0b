"""Load saved model folders as their users do, in a fresh interpreter that never imports hf_vrl:
`python load_back.py OUTPUT FOLDER...` writes one JSON object {folder: what loading found} to OUTPUT.

A stock architecture loads through its transformers class, an hf_vrl one through `AutoModel` and the remote
code the folder carries (`auto_map`); remote code is allowed only for a model type transformers does not
know (a stock type's auto_map, carried over from a pretrained folder, never runs). Missing or unexpected
weights are reported, not tolerated: a model that loads them silently starts from random weights. The
folder's image processor and tokenizer load too, where it has them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(folder: Path) -> dict[str, Any]:
    import transformers
    from transformers import CONFIG_MAPPING, AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer

    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    trust = model_type not in CONFIG_MAPPING  # hf_vrl's own types: this interpreter has no hf_vrl
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust)
    stock = getattr(transformers, (config.architectures or [""])[0], None)
    if stock is not None:
        model, info = stock.from_pretrained(folder, output_loading_info=True)
    else:
        model, info = AutoModel.from_pretrained(folder, trust_remote_code=trust, output_loading_info=True)
    found = {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        **{key: sorted(map(str, info.get(key) or [])) for key in ("missing_keys", "unexpected_keys")},
    }
    if (folder / "preprocessor_config.json").is_file():
        processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=trust)
        found["image_processor"] = type(processor).__name__
    if (folder / "tokenizer_config.json").is_file():
        found["tokenizer"] = type(AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)).__name__
    return found


def main(output: str, folders: list[str]) -> int:
    results = {}
    for folder in folders:
        try:
            results[folder] = load(Path(folder))
        except Exception as error:  # reported per folder: one folder's failure is a finding, not a crash
            results[folder] = {"error": f"{type(error).__name__}: {error}"[:2000]}
    Path(output).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
