"""DCR: CLIP-family vision tower + projector into Stable Diffusion's condition space (Hub-facing)."""

from .configuration_dcr import DCRConfig
from .modeling_dcr import DCRModel, DCRModelOutput, DCRPreTrainedModel, DCRProjector

__all__ = ["DCRConfig", "DCRModel", "DCRModelOutput", "DCRPreTrainedModel", "DCRProjector"]
