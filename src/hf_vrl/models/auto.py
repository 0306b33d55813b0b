"""Registration of hf_vrl's models with the transformers Auto classes.

After `register_auto_classes()` (run on `import hf_vrl.models`), `AutoConfig` / `AutoModel` /
`AutoModelForZeroShotImageClassification.from_pretrained(dir)` resolve hf_vrl's model types to the installed
classes, without `trust_remote_code`. The zero-shot-image-classification pipeline loads its model through
`AutoModelForZeroShotImageClassification` and reads `logits_per_image`. Add a method's classes to the tables.
"""

from transformers import AutoConfig, AutoModel, AutoModelForZeroShotImageClassification

from .clue import CLUEConfig, CLUEModel
from .dcr import DCRConfig, DCRModel
from .diffclip import (
    DiffCLIPConfig,
    DiffCLIPModel,
    DiffCLIPTextConfig,
    DiffCLIPTextModel,
    DiffCLIPVisionConfig,
    DiffCLIPVisionModel,
)

AUTO_CONFIGS = (DiffCLIPConfig, DiffCLIPTextConfig, DiffCLIPVisionConfig, DCRConfig, CLUEConfig)
AUTO_MODELS = (
    (AutoModel, CLUEConfig, CLUEModel),
    (AutoModel, DCRConfig, DCRModel),
    (AutoModel, DiffCLIPConfig, DiffCLIPModel),
    (AutoModel, DiffCLIPTextConfig, DiffCLIPTextModel),
    (AutoModel, DiffCLIPVisionConfig, DiffCLIPVisionModel),
    (AutoModelForZeroShotImageClassification, DiffCLIPConfig, DiffCLIPModel),
)


def register_auto_classes() -> None:
    """Register every config in `AUTO_CONFIGS` under its `model_type` and every (auto class, config, model) in
    `AUTO_MODELS`; idempotent."""
    for config_class in AUTO_CONFIGS:
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    for auto_class, config_class, model_class in AUTO_MODELS:
        auto_class.register(config_class, model_class, exist_ok=True)
