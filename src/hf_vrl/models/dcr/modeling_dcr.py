"""DCR vision model: a CLIP/SigLIP vision tower f_phi and the projector h_omega (DCR §3, §4.2, arXiv
2603.04803).

The model maps an image to (a) its image embedding z = f_phi(x) and (b) the diffusion condition c = h_omega(z)
fed to a frozen Stable Diffusion UNet's cross-attention. The frozen UNet, VAE and the DCR loss live outside
this file (`hf_vrl.methods.dcr`). Self-contained remote code: imports only torch and transformers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    CLIPModel,
    CLIPVisionModelWithProjection,
    PreTrainedModel,
    SiglipModel,
    SiglipVisionModel,
)
from transformers import __version__ as TRANSFORMERS_VERSION
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple

from .configuration_dcr import DCRConfig

# Compatibility with transformers 4.57 to 5.x (the configuration file refuses older versions):
# transformers.initialization (5.x) guards weights loaded from a checkpoint; 4.x initialises only missing
# weights, so torch's initialisers do there.
try:
    from transformers import initialization as init
except ImportError:
    from torch.nn import init
# transformers 4.x's CLIPModel.get_image_features returns the projected embedding tensor, 5.x's a
# BaseModelOutputWithPooling whose pooler_output it is: DCRModel's follows the installed release
FEATURES_AS_TENSOR = int(TRANSFORMERS_VERSION.split(".")[0]) < 5


def _tower_body(tower: PreTrainedModel) -> nn.Module:
    """The module holding a vision tower's `embeddings`/`encoder`/`post_layernorm`: the model itself from
    transformers 5.17 on, its `vision_model` attribute before (checkpoint keys: `vision_model.*` on all)."""
    return getattr(tower, "vision_model", tower)


@dataclass
class DCRModelOutput(ModelOutput):
    r"""
    image_embeds (`torch.FloatTensor` of shape `(batch_size, image_embed_dim)`):
        The image embedding z fed to the projector (CLIP: projected [CLS]; SigLIP: attention-pooled output).
    conditions (`torch.FloatTensor` of shape `(batch_size, num_tokens, condition_dim)`):
        The UNet condition c = h_omega(z) in the configured `condition_mode`.
    last_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`):
        The vision tower's last hidden state.
    hidden_states (`tuple(torch.FloatTensor)`, *optional*, returned when `output_hidden_states=True`):
        The vision tower's hidden states: the embeddings' output, then every layer's.
    attentions (`tuple(torch.FloatTensor)`, *optional*, returned when `output_attentions=True`):
        The vision tower's attention maps, one per layer (eager attention only, as in transformers).
    """

    image_embeds: torch.FloatTensor | None = None
    conditions: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class DCRProjector(nn.Module):
    """h_omega: LayerNorm -> Linear -> GELU -> Linear (the official `project_clip`), applied token-wise."""

    def __init__(self, config: DCRConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.image_embed_dim, eps=config.layer_norm_eps)
        self.linear_1 = nn.Linear(config.image_embed_dim, config.projector_hidden_dim)
        self.act = ACT2FN[config.projector_hidden_act]
        self.linear_2 = nn.Linear(config.projector_hidden_dim, config.condition_dim)

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(self.layer_norm(embeds))))


class DCRPreTrainedModel(PreTrainedModel):
    config: DCRConfig
    config_class = DCRConfig
    base_model_prefix = "dcr"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = [
        "CLIPEncoderLayer",
        "CLIPVisionEmbeddings",
        "SiglipEncoderLayer",
        "SiglipVisionEmbeddings",
        # nn.MultiheadAttention reads its out_proj's weight without calling it: one block for device maps
        "SiglipMultiheadAttentionPoolingHead",
    ]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def _initialize_weights(self, module, *args, **kwargs):
        """Run `_init_weights` on every module not yet initialised. transformers >= 5.x otherwise skips, in
        custom code, any module whose own tensors are all loaded or that owns none (the projector, the model
        itself with a loaded `null_text_embeds`), so the rules set there would never run. The
        `transformers.initialization` helpers leave loaded tensors alone themselves."""
        super()._initialize_weights(module)

    @torch.no_grad()
    def _init_weights(self, module):
        """Projector: LayerNorm (1, 0), linears N(0, initializer_range); CLIP's projection init; zero null
        embeds; the towers' position-id buffers (never in a checkpoint; transformers 5.0 left them unset);
        the tower's weights missing from a checkpoint by the tower's own rule (CLIP's, SigLIP's), which
        transformers' custom-code pass skips for modules owning no tensors of their own (MLP, attention)."""
        super()._init_weights(module)
        tower = getattr(module, "vision_model", None)
        if isinstance(module, DCRModel) and isinstance(tower, PreTrainedModel) and init is not torch.nn.init:
            for submodule in reversed(list(tower.modules())):  # children first, as transformers does
                tower._init_weights(submodule)
        if isinstance(getattr(module, "position_ids", None), torch.Tensor):
            module.position_ids.copy_(
                torch.arange(module.position_ids.shape[-1]).expand_as(module.position_ids)
            )
        if isinstance(module, DCRModel):
            if module.visual_projection is not None:
                std = self.config.vision_config.hidden_size**-0.5
                init.normal_(module.visual_projection.weight, mean=0.0, std=std)
            if module.null_text_embeds is not None:
                init.zeros_(module.null_text_embeds)


class DCRModel(DCRPreTrainedModel):
    """Vision tower + projector producing Stable Diffusion conditions (DCR §4.2).

    `vision_model` holds a stock `CLIPVisionModel` or `SiglipVisionModel`, so its keys are `vision_model.*`
    and the tower exports as a plain transformers checkpoint (`hf_vrl.methods.dcr.export`).
    """

    def __init__(self, config: DCRConfig):
        super().__init__(config)
        vision_config = config.vision_config
        self.vision_model = _tower_body(AutoModel.from_config(vision_config))
        self.visual_projection = (
            nn.Linear(vision_config.hidden_size, vision_config.projection_dim, bias=False)
            if config.has_visual_projection
            else None
        )
        self.projector = DCRProjector(config)
        if config.condition_mode in ("official", "cls_patches"):
            shape = (1, config.num_condition_tokens, config.condition_dim)
            self.register_buffer("null_text_embeds", torch.zeros(shape), persistent=True)
        else:
            self.null_text_embeds = None
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.vision_model.embeddings.patch_embedding

    @torch.no_grad()
    def set_null_text_embeds(self, embeds: torch.Tensor) -> None:
        """Store the diffusion model's empty-prompt text embedding (`"official"` condition mode only)."""
        if self.null_text_embeds is None:
            raise ValueError(f"condition_mode={self.config.condition_mode!r} uses no text embedding")
        embeds = embeds.reshape(-1, *embeds.shape[-2:])[:1]
        if embeds.shape != self.null_text_embeds.shape:
            raise ValueError(
                f"empty-prompt embedding has shape {tuple(embeds.shape)}, the model expects "
                f"{tuple(self.null_text_embeds.shape)}: set num_condition_tokens / condition_dim to the text "
                "encoder's context length and the UNet's cross_attention_dim"
            )
        self.null_text_embeds.copy_(embeds.to(self.null_text_embeds))

    def _embed(self, pixel_values: torch.Tensor, with_patches: bool, **tower_kwargs) -> tuple:
        """Image embedding z, patch embeddings in the same space when asked, and the tower's outputs."""
        outputs = self.vision_model(pixel_values=pixel_values, **tower_kwargs)
        hidden = outputs.last_hidden_state
        if self.visual_projection is None:
            if outputs.pooler_output is None:
                raise ValueError(
                    "the SigLIP tower needs vision_use_head=True: DCR conditions on its pooled output"
                )
            patches = hidden if with_patches else None
            return outputs.pooler_output, patches, outputs
        embeds = self.visual_projection(outputs.pooler_output)
        patches = None
        if with_patches:
            patches = self.visual_projection(self.vision_model.post_layernorm(hidden[:, 1:]))
        return embeds, patches, outputs

    def _select_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """Keep `patch_token_ratio` of the patch tokens (Table 7): random subset in training, strided in
        eval."""
        batch, num_patches, _ = patches.shape
        keep = round(self.config.patch_token_ratio * num_patches)
        if keep == 0:
            return patches[:, :0]
        if self.training:
            index = (
                torch.rand(batch, num_patches, device=patches.device)
                .argsort(dim=1)[:, :keep]
                .sort(dim=1)
                .values
            )
        else:
            index = (
                torch.linspace(0, num_patches - 1, keep, device=patches.device)
                .round()
                .long()
                .expand(batch, -1)
            )
        return patches.gather(1, index.unsqueeze(-1).expand(-1, -1, patches.shape[-1]))

    def build_conditions(
        self, image_embeds: torch.Tensor, patch_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """c = h_omega(z) arranged as UNet cross-attention tokens `[B, T, condition_dim]`.

        `"official"` (official code, the paper's main runs): the empty-prompt embedding plus h_omega(z)
        broadcast over its T tokens. `"cls"`: h_omega(z) as one token (§5.1's wording). `"cls_patches"`
        (Table 7): the `"official"` tokens followed by h_omega of the kept patch tokens, so
        `patch_token_ratio=0` is exactly the official condition, i.e. Table 7's 0% row, the main result. Patch
        tokens reach h_omega in the space of z: CLIP's through `post_layernorm` and `visual_projection` as
        [CLS]; SigLIP's (post-LN hidden states, no [CLS]) through the attention-pooling head applied to each
        token alone (`_pool_each_token`), where the pooled output z comes from.
        """
        mode = self.config.condition_mode
        if mode == "cls":
            return self.projector(image_embeds).unsqueeze(1)
        conditions = self.null_text_embeds + self.projector(image_embeds).unsqueeze(1)
        if mode == "official":
            return conditions
        patches = self._select_patches(patch_embeds)
        if self.visual_projection is None:
            patches = _pool_each_token(self.vision_model, patches)
        return torch.cat([conditions, self.projector(patches)], dim=1)

    @can_return_tuple
    def _image_outputs(self, pixel_values: torch.Tensor, **kwargs) -> BaseModelOutputWithPooling | tuple:
        """The tower's output with `pooler_output` the image embedding z `[B, image_embed_dim]`; the tower's
        hidden states and attention maps when asked (`output_hidden_states`, `output_attentions`), a tuple
        with `return_dict=False`."""
        embeds, _, tower = self._embed(pixel_values, with_patches=False, **kwargs)
        return BaseModelOutputWithPooling(
            last_hidden_state=tower.last_hidden_state,
            pooler_output=embeds,
            hidden_states=tower.hidden_states,
            attentions=tower.attentions,
        )

    def get_image_features(
        self, pixel_values: torch.Tensor, **kwargs
    ) -> torch.Tensor | BaseModelOutputWithPooling | tuple:
        """The image embedding z `[B, image_embed_dim]` (what D-ability clustering and MMVP scoring use) as
        the installed release's `CLIPModel.get_image_features` gives its embedding: 5.x the tower's output
        with z as `pooler_output` (`_image_outputs`), 4.x the tensor (`FEATURES_AS_TENSOR`)."""
        if FEATURES_AS_TENSOR:
            kwargs["return_dict"] = True
            return self._image_outputs(pixel_values, **kwargs).pooler_output
        return self._image_outputs(pixel_values, **kwargs)

    def forward(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> DCRModelOutput | tuple:
        """z, the conditions c and the tower's last hidden state; the tower's hidden states and attention maps
        when asked (or set in the config), a tuple with `return_dict=False`, as transformers models do."""
        config = self.config
        flags = {
            "output_hidden_states": config.output_hidden_states
            if output_hidden_states is None
            else output_hidden_states,
            "output_attentions": config.output_attentions if output_attentions is None else output_attentions,
        }
        with_patches = config.condition_mode == "cls_patches"
        image_embeds, patch_embeds, tower = self._embed(pixel_values, with_patches, **flags)
        output = DCRModelOutput(
            image_embeds=image_embeds,
            conditions=self.build_conditions(image_embeds, patch_embeds),
            last_hidden_state=tower.last_hidden_state,
            hidden_states=tower.hidden_states if flags["output_hidden_states"] else None,
            attentions=tower.attentions if flags["output_attentions"] else None,
        )
        return_dict = config.return_dict if return_dict is None else return_dict
        return output if return_dict else output.to_tuple()

    @classmethod
    def from_clip(
        cls,
        clip: str | PreTrainedModel,
        condition_dim: int = 1024,
        dtype: torch.dtype = torch.float32,
        **kwargs,
    ) -> DCRModel:
        """Build a DCR model around a pretrained CLIP/MetaCLIP/SigLIP checkpoint (Hub id, local dir or model).

        Accepts `CLIPModel`, `CLIPVisionModelWithProjection`, `SiglipModel` or `SiglipVisionModel` (instances
        or checkpoints). The tower and projection are copied exactly; the projector is freshly initialised.
        Extra keyword arguments go to `DCRConfig` (e.g. `condition_mode`, `num_condition_tokens`).
        """
        tower = _load_tower(clip, dtype) if isinstance(clip, str) else clip
        vision_config, vision_model, projection = _split_tower(tower)
        model = cls(DCRConfig(vision_config=vision_config.to_dict(), condition_dim=condition_dim, **kwargs))
        model.vision_model.load_state_dict(vision_model.state_dict())
        if projection is not None:
            model.visual_projection.load_state_dict(projection.state_dict())
        return model.to(dtype)


def _pool_each_token(vision_model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """SigLIP's attention-pooling head run on each token `[B, N, D]` as if it were the only one: one key gets
    attention weight 1, so the pooled vector is out_proj(W_v x + b_v), then the head's LayerNorm + MLP
    residual. Maps patch tokens into the space of the pooled output z."""
    head = next(module for module in vision_model.modules() if hasattr(module, "probe"))
    attention, dim = head.attention, head.attention.embed_dim
    packed = attention.in_proj_weight is not None
    weight = attention.in_proj_weight[2 * dim :] if packed else attention.v_proj_weight
    bias = None if attention.in_proj_bias is None else attention.in_proj_bias[2 * dim :]
    pooled = attention.out_proj(nn.functional.linear(tokens, weight, bias))
    return pooled + head.mlp(head.layernorm(pooled))


_TOWER_CLASSES = {
    "clip": CLIPModel,
    "clip_vision_model": CLIPVisionModelWithProjection,
    "siglip": SiglipModel,
    "siglip_vision_model": SiglipVisionModel,
}


def _load_tower(path: str, dtype: torch.dtype) -> PreTrainedModel:
    """Load a CLIP-family checkpoint with its own class; every weight must be in the checkpoint."""
    model_type = AutoConfig.from_pretrained(path).model_type
    if model_type not in _TOWER_CLASSES:
        raise ValueError(
            f"{path} is a {model_type!r} checkpoint; DCR supports CLIP/MetaCLIP and SigLIP towers"
        )
    cls = _TOWER_CLASSES[model_type]
    model, info = cls.from_pretrained(path, dtype=dtype, output_loading_info=True)
    if info["missing_keys"] or info["mismatched_keys"]:
        raise ValueError(
            f"{path} does not hold a complete {cls.__name__}: missing {sorted(info['missing_keys'])[:5]}, "
            f"mismatched {sorted(info['mismatched_keys'])[:5]}"
        )
    return model


def _split_tower(tower: PreTrainedModel) -> tuple:
    """(vision config, vision tower module, visual projection or None) of a CLIP-family model."""
    if isinstance(tower, CLIPModel):
        vision_config = copy.deepcopy(tower.config.vision_config)
        vision_config.projection_dim = tower.config.projection_dim
        return vision_config, tower.vision_model, tower.visual_projection
    if isinstance(tower, CLIPVisionModelWithProjection):
        return tower.config, tower.vision_model, tower.visual_projection
    if isinstance(tower, SiglipModel):
        return tower.config.vision_config, tower.vision_model, None
    if isinstance(tower, SiglipVisionModel):
        return tower.config, _tower_body(tower), None
    raise TypeError(
        f"DCRModel.from_clip got a {type(tower).__name__}; pass a CLIPModel, CLIPVisionModelWithProjection, "
        "SiglipModel, SiglipVisionModel or a path to one"
    )


DCRModel.register_for_auto_class("AutoModel")  # save_pretrained ships modeling_dcr.py (trust_remote_code)

__all__ = ["DCRModel", "DCRModelOutput", "DCRPreTrainedModel", "DCRProjector"]
