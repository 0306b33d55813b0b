"""CLUE model: a transformers backbone with ReSA's heads, CLUE's VLAD part extractor (§4.2) and a text head
(§4.3), plus the momentum copies of the backbone, projector and part extractor.

The losses (soft-InfoNCE with Sinkhorn targets, Eq. 5-8) and the momentum schedule live outside this file
(`hf_vrl.methods.clue`). Self-contained remote code: imports only torch and transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, ResNetModel, ViTModel
from transformers import __version__ as TRANSFORMERS_VERSION
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple

try:  # transformers >= 5: initialisers that leave weights loaded from a checkpoint alone
    from transformers import initialization as init
except ImportError:  # transformers 4.x initialises before loading
    from torch.nn import init

from .configuration_clue import CLUEConfig

# transformers 4.x's CLIPModel.get_image_features returns the embedding tensor, 5.x's a
# BaseModelOutputWithPooling whose pooler_output it is: CLUEModel's follows the installed release
FEATURES_AS_TENSOR = int(TRANSFORMERS_VERSION.split(".")[0]) < 5


def vlad(descriptors: torch.Tensor, assignments: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """CLUE §4.2 (NetVLAD's residual aggregation): p_k = sum_u alpha_uk (f_u - c_k).

    descriptors `[B, N, C]` (f_u), assignments `[B, N, K]` (alpha_uk), centroids `[K, C]` (c_k)
    -> `[B, K, C]`.
    """
    weighted = torch.einsum("bnk,bnc->bkc", assignments, descriptors)
    return weighted - assignments.sum(dim=1).unsqueeze(-1) * centroids


@dataclass
class CLUEOutput(ModelOutput):
    r"""Per image (`[B, ...]`) or per image and view (`[B, V, ...]` when `pixel_values` is `[B, V, 3, H, W]`).

    features (`torch.FloatTensor` `[..., feature_dim]`):
        The backbone's global feature h (what `get_image_features` returns and the linear probe sees).
    embeddings (`torch.FloatTensor` `[..., projection_dim]`):
        Online branch: the predictor's output q(g(h)); momentum branch: the projector's output g(h).
    part_descriptors (`torch.FloatTensor` `[..., num_parts, feature_dim]`):
        The VLAD part descriptors p_1..p_K (None without a part extractor).
    text_embeds (`torch.FloatTensor` `[..., text_embed_dim]`):
        The image embedding v_i aligned with the text embeddings (online branch with a text head only).
    part_assignments (`torch.FloatTensor` `[..., num_parts, h, w]`):
        The soft assignment alpha_uk of every location to every part, on the feature grid (Fig. 6), when
        `output_part_assignments=True`.
    hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned when `output_hidden_states=True`):
        The branch's backbone hidden states (ResNet: the stem's and every stage's output; ViT: the embeddings'
        and every layer's).
    attentions (`tuple(torch.FloatTensor)`, *optional*, returned when `output_attentions=True`):
        The ViT backbone's attention maps, one per layer (ResNet backbones have none and refuse the flag).
    """

    features: torch.FloatTensor | None = None
    embeddings: torch.FloatTensor | None = None
    part_descriptors: torch.FloatTensor | None = None
    text_embeds: torch.FloatTensor | None = None
    part_assignments: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class CLUEHead(nn.Module):
    """ReSA's MLP heads: (Linear, BatchNorm1d, ReLU) x (num_layers - 1), then Linear; the projector ends with
    a BatchNorm1d without affine parameters (`final_norm=True`)."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, final_norm: bool):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(num_layers - 1):
            layers += [nn.Linear(in_dim, hidden_dim), nn.BatchNorm1d(hidden_dim), nn.ReLU()]
            in_dim = hidden_dim
        layers.append(nn.Linear(in_dim, out_dim))
        if final_norm:
            layers.append(nn.BatchNorm1d(out_dim, affine=False))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class CLUEPartExtractor(nn.Module):
    """The part-assignment module (CLUE §4.2, Fig. 3b): a soft assignment of each local descriptor to K
    learnable centroids, alpha_uk = softmax_k(w_k . f_u + b_k) (NetVLAD's 1x1 convolution), and the VLAD
    residuals p_k of `vlad`."""

    def __init__(self, config: CLUEConfig):
        super().__init__()
        self.normalize_descriptors = config.part_normalize_descriptors
        self.intra_normalization = config.part_intra_normalization
        self.assignment = nn.Linear(config.feature_dim, config.num_parts)
        self.centroids = nn.Parameter(torch.empty(config.num_parts, config.feature_dim))

    def forward(self, descriptors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[B, N, C]` local descriptors -> (`[B, K, C]` part descriptors, `[B, N, K]` assignments)."""
        if self.normalize_descriptors:
            descriptors = F.normalize(descriptors, dim=-1)
        assignments = self.assignment(descriptors).softmax(dim=-1)
        parts = vlad(descriptors, assignments, self.centroids)
        if self.intra_normalization:
            parts = F.normalize(parts, dim=-1)
        return parts, assignments


def build_backbone(config) -> PreTrainedModel:
    """A `ResNetModel`, or a `ViTModel` without its pooler (the global feature is the final [CLS] token)."""
    if config.model_type == "vit":
        return ViTModel(config, add_pooling_layer=False)
    return ResNetModel(config)


class CLUEPreTrainedModel(PreTrainedModel):
    config_class = CLUEConfig
    base_model_prefix = "clue"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True  # with a ViT backbone; a ResNet one's model says False (CLUEModel)
    _supports_sdpa = True
    # the blocks of both backbones (ViTModel's, ResNetModel's) and the part extractor, whose forward reads its
    # centroids directly: each stays on one device under a device map
    _no_split_modules = [
        "ViTEmbeddings",
        "ViTLayer",
        "ResNetConvLayer",
        "ResNetShortCut",
        "CLUEPartExtractor",
    ]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Heads and part assignment: PyTorch's default Linear init (ReSA builds them with plain `nn.Linear`);
        BatchNorm (1, 0); part centroids N(0, initializer_range). The backbones initialise themselves."""
        if isinstance(module, nn.Linear):
            init.kaiming_uniform_(module.weight, a=5**0.5)
            if module.bias is not None:
                bound = module.weight.shape[1] ** -0.5
                init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, nn.BatchNorm1d):
            if module.weight is not None:
                init.ones_(module.weight)
                init.zeros_(module.bias)
            init.zeros_(module.running_mean)
            init.ones_(module.running_var)
            init.zeros_(module.num_batches_tracked)
        elif isinstance(module, CLUEPartExtractor):
            init.normal_(module.centroids, mean=0.0, std=self.config.initializer_range)


class CLUEModel(CLUEPreTrainedModel):
    """Online branch: backbone f, projector g, predictor q, part extractor, text head. Momentum branch: copies
    of f, g and the part extractor, without gradients, updated by `update_momentum` (the trainer calls it
    after every optimiser step). Both branches live in the model, so a checkpoint resumes them exactly.
    """

    def __init__(self, config: CLUEConfig):
        super().__init__(config)
        width = config.feature_dim
        self.backbone = build_backbone(config.backbone_config)
        self.projector = self._projector(config)
        self.predictor = CLUEHead(
            config.projection_dim,
            config.predictor_hidden_dim,
            config.projection_dim,
            config.predictor_num_layers,
            final_norm=False,
        )
        self.part_extractor = CLUEPartExtractor(config) if config.num_parts else None
        self.text_projector = nn.Linear(width, config.text_embed_dim) if config.text_embed_dim else None
        self.momentum_backbone = build_backbone(config.backbone_config)
        self.momentum_projector = self._projector(config)
        self.momentum_part_extractor = CLUEPartExtractor(config) if config.num_parts else None
        # gradient checkpointing is the backbone's (ViTModel has it, ResNetModel not): the class says True, as
        # the class can with a ViT (what transformers' common tests read), a model of a ResNet says False
        self.supports_gradient_checkpointing = type(self.backbone).supports_gradient_checkpointing
        self.post_init()
        self.freeze_momentum()
        self.reset_momentum()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, then the momentum branch frozen again (loading replaces the
        parameters, and the new ones require gradients: DDP would then wait for gradients that never come)."""
        loaded = super().from_pretrained(*args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).freeze_momentum()
        return loaded

    @staticmethod
    def _projector(config: CLUEConfig) -> CLUEHead:
        return CLUEHead(
            config.feature_dim,
            config.projection_hidden_dim,
            config.projection_dim,
            config.projector_num_layers,
            final_norm=True,
        )

    def momentum_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """(online, momentum) module pairs: backbone, projector and, when built, the part extractor."""
        pairs = [(self.backbone, self.momentum_backbone), (self.projector, self.momentum_projector)]
        if self.part_extractor is not None:
            pairs.append((self.part_extractor, self.momentum_part_extractor))
        return pairs

    def freeze_momentum(self) -> None:
        """No gradient for the momentum branch: it changes only through `update_momentum`."""
        for _, momentum in self.momentum_pairs():
            momentum.requires_grad_(False)

    @torch.no_grad()
    def reset_momentum(self) -> None:
        """Copy the online weights and buffers into the momentum branch (its state when training starts)."""
        for online, momentum in self.momentum_pairs():
            momentum.load_state_dict(online.state_dict())

    @torch.no_grad()
    def update_momentum(self, momentum: float) -> None:
        """theta_m <- m theta_m + (1 - m) theta (MoCo / ReSA; parameters only: the momentum branch's BatchNorm
        statistics follow its own forward passes, as in ReSA)."""
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum}")
        for online, target in self.momentum_pairs():
            target_params = list(target.parameters())
            torch._foreach_mul_(target_params, momentum)
            torch._foreach_add_(target_params, list(online.parameters()), alpha=1.0 - momentum)

    def backbone_features(
        self, pixel_values: torch.Tensor, momentum: bool = False, **backbone_kwargs
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """(global feature h `[B, C]`, local descriptors f_u `[B, N, C]`, their grid (h, w)) of one view; with
        `backbone_kwargs` (`output_hidden_states` / `output_attentions`) the backbone's output as a fourth."""
        backbone = self.momentum_backbone if momentum else self.backbone
        outputs = backbone(pixel_values=pixel_values, **backbone_kwargs)
        hidden = outputs.last_hidden_state
        if self.config.backbone_config.model_type == "vit":
            patch = self.config.backbone_config.patch_size
            grid = (pixel_values.shape[-2] // patch, pixel_values.shape[-1] // patch)
            result = hidden[:, 0], hidden[:, 1:], grid
        else:
            grid = (hidden.shape[-2], hidden.shape[-1])
            result = hidden.mean(dim=(-2, -1)), hidden.flatten(2).transpose(1, 2), grid
        return (*result, outputs) if backbone_kwargs else result

    def get_input_embeddings(self) -> nn.Module:
        """The online backbone's patch embedding (ViT) or its stem's convolution layer (ResNet)."""
        if self.config.backbone_config.model_type == "vit":
            return self.backbone.get_input_embeddings()
        return self.backbone.embedder.embedder

    def get_image_features(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | list[int] | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> torch.Tensor | BaseModelOutputWithPooling | tuple:
        """The online backbone's global feature h `[B, C]`, the representation CLUE learns, as the installed
        release's `CLIPModel.get_image_features` gives its embedding: 5.x the backbone's output with h as
        `pooler_output` (`_image_outputs`), 4.x the tensor (`FEATURES_AS_TENSOR`)."""
        flags = {"output_hidden_states": output_hidden_states, "output_attentions": output_attentions}
        if FEATURES_AS_TENSOR:
            kwargs["return_dict"] = True
            return self._image_outputs(pixel_values, **flags, **kwargs).pooler_output
        return self._image_outputs(pixel_values, **flags, **kwargs)

    @can_return_tuple
    def _image_outputs(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | list[int] | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling | tuple:
        """The online backbone's output with `pooler_output` its global feature h `[B, C]`; hidden states and
        attention maps as `forward` gives them; a tuple with `return_dict=False`."""
        flags = self._output_flags(output_hidden_states, output_attentions)
        features, _, _, outputs = self.backbone_features(pixel_values, **flags)
        return BaseModelOutputWithPooling(
            last_hidden_state=outputs.last_hidden_state,
            pooler_output=features,
            hidden_states=outputs.hidden_states if flags["output_hidden_states"] else None,
            attentions=outputs.attentions if flags.get("output_attentions") else None,
        )

    def _view(
        self, pixel_values: torch.Tensor, momentum: bool, output_part_assignments: bool, flags: dict
    ) -> CLUEOutput:
        features, local, grid, backbone_output = self.backbone_features(pixel_values, momentum, **flags)
        projector = self.momentum_projector if momentum else self.projector
        embeddings = projector(features)
        if not momentum:
            embeddings = self.predictor(embeddings)
        parts = assignments = None
        extractor = self.momentum_part_extractor if momentum else self.part_extractor
        if extractor is not None:
            parts, assignments = extractor(local)
            assignments = assignments.transpose(1, 2).unflatten(-1, grid)
        text = self.text_projector(features) if self.text_projector is not None and not momentum else None
        return CLUEOutput(
            features=features,
            embeddings=embeddings,
            part_descriptors=parts,
            text_embeds=text,
            part_assignments=assignments if output_part_assignments else None,
            hidden_states=backbone_output.hidden_states if flags["output_hidden_states"] else None,
            attentions=backbone_output.attentions if flags.get("output_attentions") else None,
        )

    def forward(
        self,
        pixel_values: torch.Tensor,
        momentum: bool = False,
        output_part_assignments: bool = False,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CLUEOutput | tuple:
        """One branch (online, or momentum with `momentum=True`) on `[B, 3, H, W]` images or `[B, V, 3, H, W]`
        views; views run one at a time, so BatchNorm sees each view's own statistics (as ReSA). The backbone's
        hidden states / attention maps when asked (or set in the config), stacked over views as the other
        outputs; a ResNet backbone has no attention maps and refuses `output_attentions=True`."""
        flags = self._output_flags(output_hidden_states, output_attentions)
        if pixel_values.dim() == 4:
            output = self._view(pixel_values, momentum, output_part_assignments, flags)
        elif pixel_values.dim() == 5:
            views = [
                self._view(pixel_values[:, v], momentum, output_part_assignments, flags)
                for v in range(pixel_values.shape[1])
            ]
            output = CLUEOutput(**{key: _stack_views(views, key) for key in CLUEOutput.__dataclass_fields__})
        else:
            raise ValueError(
                f"pixel_values must be [B, 3, H, W] or [B, V, 3, H, W], got {tuple(pixel_values.shape)}"
            )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        return output if return_dict else output.to_tuple()

    def _output_flags(
        self, output_hidden_states: bool | list[int] | None, output_attentions: bool | None
    ) -> dict:
        """The backbone's output flags: the arguments, else the config's; attention maps only from a ViT. A
        list of layer indices as `output_hidden_states` goes to the backbone as it is (ViTModel returns
        those layers only)."""
        config = self.config
        hidden = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        hidden = list(hidden) if isinstance(hidden, (list, tuple)) else bool(hidden)
        attentions = config.output_attentions if output_attentions is None else output_attentions
        if config.backbone_config.model_type != "vit":
            if output_attentions:
                raise ValueError(
                    f"output_attentions=True: CLUE's {config.backbone_config.model_type} backbone has no "
                    "attention maps (a ViT backbone has)"
                )
            return {"output_hidden_states": hidden}
        return {"output_hidden_states": hidden, "output_attentions": bool(attentions)}


def _stack_views(views: list[CLUEOutput], key: str):
    """One output of every view stacked on dim 1 (a tuple of tensors: each stacked; the None of a layer not
    asked for, `output_hidden_states=[...]`, stays None)."""
    first = getattr(views[0], key)
    if first is None:
        return None
    if isinstance(first, tuple):
        groups = zip(*(getattr(view, key) for view in views))
        return tuple(None if group[0] is None else torch.stack(group, dim=1) for group in groups)
    return torch.stack([getattr(view, key) for view in views], dim=1)


CLUEModel.register_for_auto_class("AutoModel")  # save_pretrained ships modeling_clue.py (trust_remote_code)

__all__ = ["CLUEHead", "CLUEModel", "CLUEOutput", "CLUEPartExtractor", "CLUEPreTrainedModel", "vlad"]
