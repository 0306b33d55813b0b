"""How a published model loads: its class, whether it needs `trust_remote_code=True`, and the runnable example
its card shows (zero-shot scores for an image+text model, image features for a vision model)."""

from __future__ import annotations

from dataclasses import dataclass

from hf_vrl.hub.folder import IMAGE_PROCESSOR, TOKENIZER_FILES, ModelFolder
from hf_vrl.hub.versions import remote_code_transformers

__all__ = ["LoadInfo", "load_info"]

# the output field holding the image features, for vision models whose output has no `pooler_output`
FEATURE_OUTPUTS = {"DCRModel": "image_embeds", "CLUEModel": "features"}

_DUAL = """
image = Image.open("photo.jpg").convert("RGB")
labels = ["a photo of a circle", "a photo of a square"]
pixel_values = image_processor(images=image, return_tensors="pt").pixel_values
text = tokenizer(labels, padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model(pixel_values=pixel_values, **text).logits_per_image
print(dict(zip(labels, logits.softmax(dim=-1)[0].tolist())))
"""

_VISION = """
image = Image.open("photo.jpg").convert("RGB")
pixel_values = image_processor(images=image, return_tensors="pt").pixel_values
with torch.no_grad():
    features = model(pixel_values=pixel_values).{output}
print(features.shape)
"""


@dataclass(frozen=True)
class LoadInfo:
    """The class a model loads with, whether it is remote code, the `from_pretrained` line, the example and
    what a reader needs to know to run it (`note`, Markdown)."""

    model_class: str
    remote_code: bool
    dual_encoder: bool  # an image and a text tower (CLIP-like)
    from_pretrained: str
    code: str

    @property
    def note(self) -> str:
        if not self.remote_code:
            return f"A stock transformers `{self.model_class}`: no custom code, no hf_vrl needed."
        return (
            f"`{self.model_class}` with `trust_remote_code=True` runs the model's own code from this "
            f"repository, on `transformers{remote_code_transformers()}`, without hf_vrl. Where hf_vrl is "
            "installed, `import hf_vrl.models` registers the classes and `trust_remote_code` can be left out."
        )


def load_info(folder: ModelFolder, repo_id: str, subfolder: str | None = None) -> LoadInfo:
    """How `folder`, published as `repo_id` (in `subfolder` of it), loads."""
    import transformers

    files = folder.files()
    architecture = (folder.config.get("architectures") or ["AutoModel"])[0]
    plain = not folder.remote_code and hasattr(transformers, architecture)
    model_class = architecture if plain else "AutoModel"
    where = f'"{repo_id}"' + (f', subfolder="{subfolder}"' if subfolder else "")
    trust = "" if plain else ", trust_remote_code=True"
    lines = [f"model = {model_class}.from_pretrained({where}{trust})"]
    classes = {model_class}
    if IMAGE_PROCESSOR in files:
        lines.append(f"image_processor = AutoImageProcessor.from_pretrained({where})")
        classes.add("AutoImageProcessor")
    dual = folder.dual_encoder and any(name in files for name in TOKENIZER_FILES)
    if dual:
        # AutoTokenizer reads the model's config.json: remote code there needs the same permission
        lines.append(f"tokenizer = AutoTokenizer.from_pretrained({where}{trust})")
        classes.add("AutoTokenizer")
    example = _DUAL if dual else _VISION.format(output=FEATURE_OUTPUTS.get(architecture, "pooler_output"))
    if IMAGE_PROCESSOR not in files:  # no preprocessing to show: the loading lines alone
        example = ""
    header = [
        "import torch",
        "from PIL import Image",
        f"from transformers import {', '.join(sorted(classes))}",
    ]
    code = "\n".join(header) + "\n\n" + "\n".join(lines) + "\n" + example
    return LoadInfo(model_class, not plain, dual, lines[0], code.strip())
