"""CLUE: a ResNet/ViT backbone with ReSA's heads, the VLAD part extractor and a text head (Hub-facing)."""

from .configuration_clue import CLUEConfig
from .modeling_clue import CLUEHead, CLUEModel, CLUEOutput, CLUEPartExtractor, CLUEPreTrainedModel, vlad

__all__ = [
    "CLUEConfig",
    "CLUEHead",
    "CLUEModel",
    "CLUEOutput",
    "CLUEPartExtractor",
    "CLUEPreTrainedModel",
    "vlad",
]
