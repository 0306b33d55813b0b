"""PyTorch DiffCLIP: CLIP with differential attention (Hammoud & Ghanem, "DiffCLIP: Differential Attention
Meets CLIP", TMLR 2025; differential attention from Ye et al., "Differential Transformer", 2024).

Mirrors transformers' `modeling_clip.py` (same module names, so a CLIP state dict loads with only the new
differential-attention leaves missing) and follows the released DiffCLIP code where the paper is silent:

* `num_attention_heads` is the baseline CLIP head count H; adjacent heads (2m, 2m+1) form the pair (Q1, K1),
  (Q2, K2) of differential head m, and its value is the 2·head_dim wide slice m of `v_proj` (H/2 differential
  heads);
* λ = exp(Σ λ_q1⊙λ_k1) − exp(Σ λ_q2⊙λ_k2) + λ_init, one scalar per layer (λ vectors of size head_dim shared by
  heads);
* O_m = RMSNorm((A1 − λ·A2)·V_m)·(1 − λ_init), one RMSNorm (2·head_dim, learnable weight, eps 1e-5, computed
  in float32) shared by the heads of a layer, then `out_proj`.

This file imports only torch, transformers, `.configuration_diffclip` and `.differential_tail` (the fused tail
and its optional Triton kernels), so it ships as Hub remote code with both beside it.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import __version__ as TRANSFORMERS_VERSION
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs, logging, torch_int
from transformers.utils.generic import can_return_tuple

from .configuration_diffclip import (
    DiffCLIPConfig,
    DiffCLIPTextConfig,
    DiffCLIPTowerConfig,
    DiffCLIPVisionConfig,
)
from .differential_attention import (
    DiffCLIPRMSNorm,
    differential_head_output,
    differential_tail,
    eager_attention_forward,
    eager_differential_attention_forward,
    kernel_differential_attention_forward,
)

logger = logging.get_logger(__name__)

# Compatibility with transformers 4.57 to 5.x (the configuration file refuses older versions), in one place:
try:  # transformers >= 5: initialisers that leave weights loaded from a checkpoint alone
    from transformers import initialization as init
except ImportError:  # 4.x initialises only the weights a checkpoint lacks, so torch's initialisers do
    from torch.nn import init
# transformers 4.x's CLIPModel.get_image_features / get_text_features return the projected embedding tensor,
# 5.x's a BaseModelOutputWithPooling whose pooler_output it is: DiffCLIPModel's follow the installed release
FEATURES_AS_TENSOR = int(TRANSFORMERS_VERSION.split(".")[0]) < 5
try:  # transformers >= 5.17; before, the same decorator (same signature, `_can_record_outputs`) had this name
    from transformers.utils.output_capturing import capture_outputs
except ImportError:
    from transformers.utils.generic import check_model_inputs as capture_outputs


def contrastive_loss(logits: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, torch.arange(len(logits), device=logits.device))


def image_text_contrastive_loss(similarity: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE of CLIP (DiffCLIP §3.3): the mean of the text-to-image and image-to-text losses."""
    if similarity.shape[0] != similarity.shape[1]:
        raise ValueError(
            f"return_loss needs paired inputs (text i describes image i), got {similarity.shape[0]} "
            f"texts and {similarity.shape[1]} images; pass as many texts as images."
        )
    return (contrastive_loss(similarity) + contrastive_loss(similarity.T)) / 2.0


def _get_vector_norm(tensor: torch.Tensor) -> torch.Tensor:
    """L2 norm over the last dim, written out as in transformers' CLIP (export friendly)."""
    return torch.pow(torch.sum(torch.pow(tensor, 2), dim=-1, keepdim=True), 0.5)


@dataclass
class DiffCLIPVisionModelOutput(ModelOutput):
    """Vision tower output with the projected `image_embeds` (as `CLIPVisionModelOutput`)."""

    image_embeds: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class DiffCLIPTextModelOutput(ModelOutput):
    """Text tower output with the projected `text_embeds` (as `CLIPTextModelOutput`)."""

    text_embeds: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class DiffCLIPOutput(ModelOutput):
    """Dual-encoder output (as `CLIPOutput`): `logits_per_image` is `[n_images, n_texts]`, embeddings are
    L2-normalised, `loss` is the symmetric contrastive loss when `return_loss=True`."""

    loss: torch.Tensor | None = None
    logits_per_image: torch.Tensor | None = None
    logits_per_text: torch.Tensor | None = None
    text_embeds: torch.Tensor | None = None
    image_embeds: torch.Tensor | None = None
    text_model_output: BaseModelOutputWithPooling = None
    vision_model_output: BaseModelOutputWithPooling = None

    def to_tuple(self) -> tuple[Any]:
        return tuple(v.to_tuple() if isinstance(v, ModelOutput) else v for v in self.values())


class DiffCLIPVisionEmbeddings(nn.Module):
    """CLIP's patch + class + position embeddings (`CLIPVisionEmbeddings`)."""

    def __init__(self, config: DiffCLIPVisionConfig):
        super().__init__()
        self.config = config
        self.embed_dim = config.hidden_size
        self.image_size = config.image_size
        self.patch_size = config.patch_size
        self.class_embedding = nn.Parameter(torch.randn(self.embed_dim))
        self.patch_embedding = nn.Conv2d(
            config.num_channels,
            self.embed_dim,
            kernel_size=self.patch_size,
            stride=self.patch_size,
            bias=False,
        )
        self.num_patches = (self.image_size // self.patch_size) ** 2
        self.num_positions = self.num_patches + 1
        self.position_embedding = nn.Embedding(self.num_positions, self.embed_dim)
        self.position_ids = nn.Buffer(torch.arange(self.num_positions).expand((1, -1)), persistent=False)

    def interpolate_pos_encoding(self, embeddings: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Bicubically resize the patch position embeddings to a `height` × `width` image (as CLIP)."""
        num_patches = embeddings.shape[1] - 1
        position_embedding = self.position_embedding(self.position_ids)  # the module's forward: offload hooks
        num_positions = position_embedding.shape[1] - 1
        if not torch.jit.is_tracing() and num_patches == num_positions and height == width:
            return self.position_embedding(self.position_ids)
        class_pos_embed = position_embedding[:, :1]
        patch_pos_embed = position_embedding[:, 1:]
        dim = embeddings.shape[-1]
        side = torch_int(num_positions**0.5)
        patch_pos_embed = patch_pos_embed.reshape(1, side, side, dim).permute(0, 3, 1, 2)
        patch_pos_embed = nn.functional.interpolate(
            patch_pos_embed,
            size=(height // self.patch_size, width // self.patch_size),
            mode="bicubic",
            align_corners=False,
        )
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed, patch_pos_embed), dim=1)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        batch_size, _, height, width = pixel_values.shape
        if not interpolate_pos_encoding and (height != self.image_size or width != self.image_size):
            raise ValueError(
                f"Input image size ({height}*{width}) doesn't match model "
                f"({self.image_size}*{self.image_size}); "
                "resize the images or pass interpolate_pos_encoding=True."
            )
        patch_embeds = self.patch_embedding(pixel_values.to(dtype=self.patch_embedding.weight.dtype))
        patch_embeds = patch_embeds.flatten(2).transpose(1, 2)
        class_embeds = self.class_embedding.expand(batch_size, 1, -1)
        embeddings = torch.cat([class_embeds, patch_embeds], dim=1)
        if interpolate_pos_encoding:
            return embeddings + self.interpolate_pos_encoding(embeddings, height, width)
        return embeddings + self.position_embedding(self.position_ids)


class DiffCLIPTextEmbeddings(nn.Module):
    """CLIP's token + position embeddings (`CLIPTextEmbeddings`)."""

    def __init__(self, config: DiffCLIPTextConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embedding = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.position_ids = nn.Buffer(
            torch.arange(config.max_position_embeddings).expand((1, -1)), persistent=False
        )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        seq_length = input_ids.shape[-1] if input_ids is not None else inputs_embeds.shape[-2]
        max_positions = self.position_embedding.weight.shape[0]
        if seq_length > max_positions:
            raise ValueError(
                f"Sequence length ({seq_length}) exceeds max_position_embeddings ({max_positions}); "
                "truncate the text (tokenizer truncation=True, max_length=max_position_embeddings)."
            )
        if position_ids is None:
            position_ids = self.position_ids[:, :seq_length]
        if inputs_embeds is None:
            inputs_embeds = self.token_embedding(input_ids)
        return inputs_embeds + self.position_embedding(position_ids)


def text_causal_mask(attention_mask: torch.Tensor | None, hidden_states: torch.Tensor) -> torch.Tensor:
    """Boolean `[B, 1, N, N]` mask of the text tower (True: may attend): causal, padding keys hidden.

    Built here rather than by transformers' `create_causal_mask`, whose signature changed between 4.57 and
    5.x, so every version runs the same attention. Fully hidden rows (left padding) give zeros in SDPA and
    finite values in the eager path, never NaN.
    """
    batch, length = hidden_states.shape[:2]
    device = hidden_states.device
    visible = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    if attention_mask is None:
        return visible.expand(batch, 1, length, length)
    return visible & attention_mask[:, None, None, :].to(device=device, dtype=torch.bool)


class DiffCLIPAttention(nn.Module):
    """Multi-head attention of one DiffCLIP layer: differential attention (DiffCLIP §3.2, Diff MHA) when
    `config.differential_attention`, else CLIP's attention. Biases on q/k/v/out as in CLIP.

    On CUDA q/k/v run as one matrix product over the concatenated `q_proj`/`k_proj`/`v_proj` weights (the
    checkpoint keys stay CLIP's), see `project_qkv`.
    `fused_tail=False` selects the plain differential tail (for tests and benchmarks)."""

    fused_tail = True

    def __init__(self, config: DiffCLIPTowerConfig, layer_idx: int = 0):
        super().__init__()
        self.config = config
        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.scale = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_causal = False
        self.differential = config.differential_attention

        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)

        if self.differential:
            self.lambda_init = config.lambda_init_for_layer(layer_idx)
            self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim))
            self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim))
            self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim))
            self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim))
            self.diff_norm = DiffCLIPRMSNorm(2 * self.head_dim, eps=config.diff_norm_eps)

    def lambda_full(self) -> torch.Tensor:
        """λ = exp(Σ λ_q1⊙λ_k1) − exp(Σ λ_q2⊙λ_k2) + λ_init (DiffCLIP §3.2), a float32 scalar."""
        lambda_1 = torch.exp(torch.sum(self.lambda_q1.float() * self.lambda_k1.float()))
        lambda_2 = torch.exp(torch.sum(self.lambda_q2.float() * self.lambda_k2.float()))
        return lambda_1 - lambda_2 + self.lambda_init

    def attention_interface(self) -> Callable:
        """The attention function `config._attn_implementation` names (eager: this file's). Written so that
        every transformers version finds the call it looks for to allow `set_attn_implementation`."""
        if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):  # transformers >= 5.x
            return ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
        if self.config._attn_implementation == "eager":  # older releases do not register eager
            return eager_attention_forward
        return ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]

    def project_qkv(
        self, hidden_states: torch.Tensor, fused: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V `[B, N, D]`, by default as one matrix product on CUDA (one read of the input, one kernel
        each way; the concatenated weight is a small copy next to a training batch's activations) and as
        three on the CPU (where that copy, kept for backward, would outweigh a small batch's activations).
        Always three when q/k/v are not plain `nn.Linear`s (LoRA, quantised layers) or carry hooks that load
        their weights in their own forward (accelerate's offload: the weights are on `meta` until then)."""
        layers = (self.q_proj, self.k_proj, self.v_proj)
        fused = hidden_states.is_cuda if fused is None else fused
        plain = all(
            type(layer) is nn.Linear and not hasattr(layer, "_hf_hook") and not layer.weight.is_meta
            for layer in layers
        )
        if not fused or not plain:
            return tuple(layer(hidden_states) for layer in layers)
        weight = torch.cat([layer.weight for layer in layers])
        bias = torch.cat([layer.bias for layer in layers])
        return nn.functional.linear(hidden_states, weight, bias).chunk(3, dim=-1)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[B, N, D]` -> `[B, N, D]` and the attention maps (eager only; differential maps A1 − λ·A2 when
        differential)."""
        input_shape = hidden_states.shape[:-1]
        queries, keys, values = self.project_qkv(hidden_states)
        dropout = 0.0 if not self.training else self.dropout
        if self.differential:
            attn_output, attn_weights = self._differential(
                queries, keys, values, attention_mask, dropout, **kwargs
            )
        else:
            hidden_shape = (*input_shape, -1, self.head_dim)
            attn_output, attn_weights = self.attention_interface()(
                self,
                queries.view(hidden_shape).transpose(1, 2),
                keys.view(hidden_shape).transpose(1, 2),
                values.view(hidden_shape).transpose(1, 2),
                attention_mask,
                scaling=self.scale,
                dropout=dropout,
                **kwargs,
            )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.out_proj(attn_output), attn_weights

    def _differential(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """O_m = RMSNorm((A1 − λ·A2)·V_m)·(1 − λ_init) for each differential head m, `[B, N, H/2, 2d]`."""
        batch, length = queries.shape[:2]
        pair_shape = (batch, length, self.num_heads // 2, 2, self.head_dim)
        queries = queries.view(pair_shape).permute(0, 2, 3, 1, 4)  # [B, H/2, 2, N, d]
        keys = keys.view(pair_shape).permute(0, 2, 3, 1, 4)
        values = values.view(batch, length, self.num_heads // 2, 2 * self.head_dim).transpose(1, 2)
        lambda_full = self.lambda_full()
        if self.config._attn_implementation == "eager":
            difference, attn_weights = eager_differential_attention_forward(
                self, queries, keys, values, attention_mask, self.scale, lambda_full, dropout
            )
            return differential_head_output(difference, self.diff_norm, self.lambda_init), attn_weights
        out_1, out_2 = kernel_differential_attention_forward(
            self.attention_interface(),
            self,
            queries,
            keys,
            values,
            attention_mask,
            self.scale,
            dropout,
            **kwargs,
        )
        tail = differential_tail(out_1, out_2, lambda_full, self.diff_norm, self.lambda_init, self.fused_tail)
        return tail, None


class DiffCLIPMLP(nn.Module):
    """CLIP's feed-forward block: fc1 -> activation -> fc2."""

    def __init__(self, config: DiffCLIPTowerConfig):
        super().__init__()
        self.config = config
        self.activation_fn = ACT2FN[config.hidden_act]
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))


class DiffCLIPEncoderLayer(GradientCheckpointingLayer):
    """Pre-LN transformer block: x + attn(LN1(x)), then + MLP(LN2(·)) (CLIP's `CLIPEncoderLayer`)."""

    def __init__(self, config: DiffCLIPTowerConfig, layer_idx: int = 0):
        super().__init__()
        self.embed_dim = config.hidden_size
        self.self_attn = DiffCLIPAttention(config, layer_idx)
        self.layer_norm1 = nn.LayerNorm(self.embed_dim, eps=config.layer_norm_eps)
        self.mlp = DiffCLIPMLP(config)
        self.layer_norm2 = nn.LayerNorm(self.embed_dim, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(
            self.layer_norm1(hidden_states), attention_mask=attention_mask, **kwargs
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.layer_norm2(hidden_states))


def _init_child_weight(child: nn.Module, std: float) -> None:
    """Normal-initialise `child.weight` when the child still carries one (quantisation may remove it)."""
    if getattr(child, "weight", None) is not None:
        init.normal_(child.weight, std=std)


def _init_torch_default(layer: nn.Linear | nn.Conv2d) -> None:
    """PyTorch's own `reset_parameters` of a Linear/Conv: weight kaiming_uniform(a=sqrt(5)), i.e.
    U(±1/sqrt(fan_in)), and bias U(±1/sqrt(fan_in))."""
    init.kaiming_uniform_(layer.weight, a=math.sqrt(5))
    if layer.bias is not None:
        bound = layer.weight[0].numel() ** -0.5
        init.uniform_(layer.bias, -bound, bound)


class DiffCLIPPreTrainedModel(PreTrainedModel):
    config_class = DiffCLIPConfig
    base_model_prefix = "diffclip"
    input_modalities = ("image", "text")
    _no_split_modules = ["DiffCLIPTextEmbeddings", "DiffCLIPEncoderLayer", "DiffCLIPVisionEmbeddings"]
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    # Flash kernels need equal q/k and v head dims; differential heads read a 2·head_dim value.
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False
    _can_record_outputs = {"hidden_states": DiffCLIPEncoderLayer, "attentions": DiffCLIPAttention}

    def _initialize_weights(self, module, *args, **kwargs):
        """Run `_init_weights` on every module not yet initialised. transformers >= 5.x otherwise skips, in
        custom code, any module whose own parameters are all loaded, which includes modules that own none
        (the MLP, plain attention): their Linear layers would keep the generic init. `_init_weights` uses the
        `transformers.initialization` helpers, which leave loaded tensors alone themselves."""
        super()._initialize_weights(module)

    @torch.no_grad()
    def _init_weights(self, module):
        """Each tower by its `initializer_style`: CLIP's init (`"clip"`) or the released DiffCLIP's
        (`"release"`); both give λ vectors ~ N(0, lambda_std), RMSNorm weights 1 and the projections
        N(0, width^-0.5), `logit_scale` its configured initial value."""
        super()._init_weights(module)
        factor = self.config.initializer_factor
        tower_config = getattr(module, "config", None)
        release = (
            isinstance(tower_config, DiffCLIPTowerConfig) and tower_config.initializer_style == "release"
        )
        if release and isinstance(module, RELEASE_INIT_MODULES):
            self._init_release_style(module)
        elif isinstance(module, DiffCLIPTextEmbeddings):
            _init_child_weight(module.token_embedding, factor * 0.02)
            _init_child_weight(module.position_embedding, factor * 0.02)
        elif isinstance(module, DiffCLIPVisionEmbeddings):
            init.normal_(module.class_embedding, mean=0.0, std=module.embed_dim**-0.5 * factor)
            _init_child_weight(module.patch_embedding, module.config.initializer_range * factor)
            _init_child_weight(module.position_embedding, module.config.initializer_range * factor)
        elif isinstance(module, DiffCLIPAttention):
            in_proj_std = (module.embed_dim**-0.5) * ((2 * module.config.num_hidden_layers) ** -0.5) * factor
            for child in (module.q_proj, module.k_proj, module.v_proj):
                _init_child_weight(child, in_proj_std)
            _init_child_weight(module.out_proj, (module.embed_dim**-0.5) * factor)
        elif isinstance(module, DiffCLIPMLP):
            in_proj_std = (
                (module.config.hidden_size**-0.5) * ((2 * module.config.num_hidden_layers) ** -0.5) * factor
            )
            _init_child_weight(module.fc1, (2 * module.config.hidden_size) ** -0.5 * factor)
            _init_child_weight(module.fc2, in_proj_std)
        elif isinstance(module, DiffCLIPModel):
            _init_child_weight(module.text_projection, module.text_embed_dim**-0.5 * factor)
            _init_child_weight(module.visual_projection, module.vision_embed_dim**-0.5 * factor)
            init.constant_(module.logit_scale, self.config.logit_scale_init_value)
        elif isinstance(module, DiffCLIPVisionModelWithProjection):
            _init_child_weight(module.visual_projection, self.config.hidden_size**-0.5 * factor)
        elif isinstance(module, DiffCLIPTextModelWithProjection):
            _init_child_weight(module.text_projection, self.config.hidden_size**-0.5 * factor)
        if isinstance(module, (DiffCLIPTextEmbeddings, DiffCLIPVisionEmbeddings)):
            module.position_ids.copy_(torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, DiffCLIPAttention) and module.differential:
            for vector in (module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2):
                init.normal_(vector, mean=0.0, std=module.config.lambda_std)
        elif isinstance(module, DiffCLIPRMSNorm):
            init.ones_(module.weight)

    def _init_release_style(self, module: nn.Module) -> None:
        """The released DiffCLIP's init (hammoudhasan/DiffCLIP `diff_clip.py` / `diff_attention.py`).

        Text tower (`DiffCLIP.initialize_parameters`, OpenAI/SLIP CLIP's rules): token embedding N(0, 0.02),
        positions N(0, 0.01), q/k/v weights N(0, w^-0.5), out_proj and fc2 weights N(0, w^-0.5·(2L)^-0.5), fc1
        N(0, (2w)^-0.5); its Linear biases keep PyTorch's default (separate q/k/v Linears, not
        `nn.MultiheadAttention`, whose biases start at 0). Vision tower (a timm ViT whose blocks and final
        norm are rebuilt after timm's init): class token N(0, 1e-6), positions truncated N(0, 0.02), and the
        patch projection and every block Linear PyTorch's default U(±1/sqrt(fan_in)) (kaiming_uniform,
        a=sqrt(5)). LayerNorms (1, 0) in both, by the base class.
        """
        config = module.config
        width, layers = config.hidden_size, config.num_hidden_layers
        text = isinstance(config, DiffCLIPTextConfig)
        if isinstance(module, DiffCLIPTextEmbeddings):
            init.normal_(module.token_embedding.weight, std=0.02)
            init.normal_(module.position_embedding.weight, std=0.01)
        elif isinstance(module, DiffCLIPVisionEmbeddings):
            init.normal_(module.class_embedding, std=1e-6)
            init.trunc_normal_(module.position_embedding.weight, std=0.02, a=-2.0, b=2.0)
            _init_torch_default(module.patch_embedding)
        elif isinstance(module, (DiffCLIPAttention, DiffCLIPMLP)):
            for child in module.children():
                if isinstance(child, nn.Linear):
                    _init_torch_default(child)
            if text and isinstance(module, DiffCLIPAttention):
                for child in (module.q_proj, module.k_proj, module.v_proj):
                    _init_child_weight(child, width**-0.5)
                _init_child_weight(module.out_proj, width**-0.5 * (2 * layers) ** -0.5)
            elif text:
                _init_child_weight(module.fc1, (2 * width) ** -0.5)
                _init_child_weight(module.fc2, width**-0.5 * (2 * layers) ** -0.5)


RELEASE_INIT_MODULES = (DiffCLIPTextEmbeddings, DiffCLIPVisionEmbeddings, DiffCLIPAttention, DiffCLIPMLP)


class DiffCLIPEncoder(nn.Module):
    """A stack of `config.num_hidden_layers` [`DiffCLIPEncoderLayer`]s; layer `i` gets λ_init(i)."""

    def __init__(self, config: DiffCLIPTowerConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(
            [DiffCLIPEncoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.gradient_checkpointing = False

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        hidden_states = inputs_embeds
        for encoder_layer in self.layers:
            hidden_states = encoder_layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


class DiffCLIPTextModel(DiffCLIPPreTrainedModel):
    """The DiffCLIP text tower (causal transformer, EOS pooling) without projection."""

    config_class = DiffCLIPTextConfig
    base_model_prefix = "text_model"  # loads the text tower out of a DiffCLIPModel checkpoint
    input_modalities = ("text",)
    _input_embed_layer = "token_embedding"

    def __init__(self, config: DiffCLIPTextConfig):
        super().__init__(config)
        self.embeddings = DiffCLIPTextEmbeddings(config)
        self.encoder = DiffCLIPEncoder(config)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.eos_token_id = config.eos_token_id
        self.post_init()

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling:
        """`pooler_output` is the final-LayerNorm state at the first EOS token (CLIP's pooling; a text without
        one is pooled at its first position, as CLIP does, with a warning)."""
        if input_ids is None:
            raise ValueError("You have to specify input_ids")
        input_ids = input_ids.view(-1, input_ids.shape[-1])
        hidden_states = self.embeddings(input_ids=input_ids, position_ids=position_ids)
        attention_mask = text_causal_mask(attention_mask, hidden_states)
        kwargs.pop("is_causal", None)  # causality is in the mask
        encoder_outputs = self.encoder(inputs_embeds=hidden_states, attention_mask=attention_mask, **kwargs)
        last_hidden_state = self.final_layer_norm(encoder_outputs.last_hidden_state)
        ids = input_ids.to(dtype=torch.int, device=last_hidden_state.device)
        if self.eos_token_id == 2:
            # Legacy CLIP configs (before transformers PR #24773): the EOS token has the highest id.
            eos_positions = ids.argmax(dim=-1)
        else:
            is_eos = ids == self.eos_token_id
            if not torch.compiler.is_compiling() and not is_eos.any(dim=-1).all():
                logger.warning_once(
                    f"A text has no EOS token (id {self.eos_token_id}), where the text embedding is pooled; "
                    "it is pooled at its first token, as CLIP does. Set text_config.eos_token_id to your "
                    "tokenizer's EOS id and keep EOS when truncating."
                )
            eos_positions = is_eos.int().argmax(dim=-1)
        batch_index = torch.arange(last_hidden_state.shape[0], device=last_hidden_state.device)
        pooled_output = last_hidden_state[batch_index, eos_positions]
        return BaseModelOutputWithPooling(last_hidden_state=last_hidden_state, pooler_output=pooled_output)


class DiffCLIPVisionModel(DiffCLIPPreTrainedModel):
    """The DiffCLIP vision tower (ViT, class-token pooling) without projection."""

    config_class = DiffCLIPVisionConfig
    base_model_prefix = "vision_model"  # loads the vision tower out of a DiffCLIPModel checkpoint
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _input_embed_layer = "patch_embedding"

    def __init__(self, config: DiffCLIPVisionConfig):
        super().__init__(config)
        embed_dim = config.hidden_size
        self.embeddings = DiffCLIPVisionEmbeddings(config)
        if config.pre_layernorm:
            self.pre_layrnorm = nn.LayerNorm(embed_dim, eps=config.layer_norm_eps)
        else:
            self.pre_layrnorm = nn.Identity()
        self.encoder = DiffCLIPEncoder(config)
        self.post_layernorm = nn.LayerNorm(embed_dim, eps=config.layer_norm_eps)
        self.post_init()

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling:
        """`pooler_output` is `post_layernorm` of the class token (CLIP's pooling)."""
        hidden_states = self.embeddings(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)
        hidden_states = self.pre_layrnorm(hidden_states)
        encoder_outputs = self.encoder(inputs_embeds=hidden_states, **kwargs)
        last_hidden_state = encoder_outputs.last_hidden_state
        pooled_output = self.post_layernorm(last_hidden_state[:, 0, :])
        return BaseModelOutputWithPooling(last_hidden_state=last_hidden_state, pooler_output=pooled_output)


class DiffCLIPModel(DiffCLIPPreTrainedModel):
    """DiffCLIP dual encoder: both towers, bias-free projections and the learnable `logit_scale`."""

    def __init__(self, config: DiffCLIPConfig):
        super().__init__(config)
        text_config = config.text_config
        vision_config = config.vision_config
        self.projection_dim = config.projection_dim
        self.text_embed_dim = text_config.hidden_size
        self.vision_embed_dim = vision_config.hidden_size
        self.text_model = DiffCLIPTextModel._from_config(text_config)
        self.vision_model = DiffCLIPVisionModel._from_config(vision_config)
        self.visual_projection = nn.Linear(self.vision_embed_dim, self.projection_dim, bias=False)
        self.text_projection = nn.Linear(self.text_embed_dim, self.projection_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(self.config.logit_scale_init_value))
        self.post_init()

    # besides AutoModel, what `auto_map` names this class for: the zero-shot pipeline loads with it
    extra_auto_classes = ("AutoModelForZeroShotImageClassification",)

    def save_pretrained(self, save_directory, *args: Any, **kwargs: Any):
        """`PreTrainedModel.save_pretrained`, with `auto_map` also naming this class for
        `AutoModelForZeroShotImageClassification`, so that `pipeline("zero-shot-image-classification",
        model=folder, trust_remote_code=True)` runs without hf_vrl."""
        reference = f"{type(self).__module__.rsplit('.', 1)[-1]}.{type(self).__name__}"
        auto_map = dict(getattr(self.config, "auto_map", None) or {})
        for auto_class in self.extra_auto_classes:
            auto_map.setdefault(auto_class, reference)
        self.config.auto_map = auto_map
        return super().save_pretrained(save_directory, *args, **kwargs)

    @can_return_tuple
    def _text_outputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple | BaseModelOutputWithPooling:
        """Text tower output whose `pooler_output` is the projected (unnormalised) text embedding `[B, D]`."""
        text_outputs: BaseModelOutputWithPooling = self.text_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            return_dict=True,
            **kwargs,
        )
        text_outputs.pooler_output = self.text_projection(text_outputs.pooler_output)
        return text_outputs

    @can_return_tuple
    def _image_outputs(
        self,
        pixel_values: torch.Tensor,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple | BaseModelOutputWithPooling:
        """Vision tower output; `pooler_output` is the projected, unnormalised image embedding `[B, D]`."""
        vision_outputs: BaseModelOutputWithPooling = self.vision_model(
            pixel_values=pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            return_dict=True,
            **kwargs,
        )
        vision_outputs.pooler_output = self.visual_projection(vision_outputs.pooler_output)
        return vision_outputs

    def get_text_features(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor | tuple | BaseModelOutputWithPooling:
        """The projected (unnormalised) text embedding `[B, D]` as the installed release's CLIPModel gives it:
        5.x the text tower's output with it as `pooler_output` (a tuple with return_dict=False), 4.x the
        tensor (`FEATURES_AS_TENSOR`)."""
        if FEATURES_AS_TENSOR:
            kwargs["return_dict"] = True
            return self._text_outputs(input_ids, attention_mask, position_ids, **kwargs).pooler_output
        return self._text_outputs(input_ids, attention_mask, position_ids, **kwargs)

    def get_image_features(
        self,
        pixel_values: torch.Tensor,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor | tuple | BaseModelOutputWithPooling:
        """The projected (unnormalised) image embedding `[B, D]` as the installed release's CLIPModel gives
        it: 5.x the vision tower's output with it as `pooler_output` (a tuple with return_dict=False), 4.x the
        tensor (`FEATURES_AS_TENSOR`)."""
        if FEATURES_AS_TENSOR:
            kwargs["return_dict"] = True
            return self._image_outputs(pixel_values, interpolate_pos_encoding, **kwargs).pooler_output
        return self._image_outputs(pixel_values, interpolate_pos_encoding, **kwargs)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        pixel_values: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        return_loss: bool | None = None,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> DiffCLIPOutput:
        """Cosine logits scaled by exp(logit_scale); `return_loss=True` adds CLIP's symmetric loss."""
        vision_outputs = self._image_outputs(
            pixel_values=pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, **kwargs
        )
        text_outputs = self._text_outputs(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        image_embeds = vision_outputs.pooler_output
        text_embeds = text_outputs.pooler_output
        image_embeds = image_embeds / _get_vector_norm(image_embeds)
        text_embeds = text_embeds / _get_vector_norm(text_embeds)
        logits_per_text = torch.matmul(text_embeds, image_embeds.t().to(text_embeds.device))
        logits_per_text = logits_per_text * self.logit_scale.exp().to(text_embeds.device)
        logits_per_image = logits_per_text.t()
        loss = image_text_contrastive_loss(logits_per_text) if return_loss else None
        return DiffCLIPOutput(
            loss=loss,
            logits_per_image=logits_per_image,
            logits_per_text=logits_per_text,
            text_embeds=text_embeds,
            image_embeds=image_embeds,
            text_model_output=text_outputs,
            vision_model_output=vision_outputs,
        )


class DiffCLIPTextModelWithProjection(DiffCLIPPreTrainedModel):
    """The text tower with its projection: `text_embeds` is the projected pooled output."""

    config_class = DiffCLIPTextConfig
    base_model_prefix = "text_model"
    input_modalities = ("text",)

    def __init__(self, config: DiffCLIPTextConfig):
        super().__init__(config)
        self.text_model = DiffCLIPTextModel._from_config(config)
        self.text_projection = nn.Linear(config.hidden_size, config.projection_dim, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.text_model.embeddings.token_embedding

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.text_model.embeddings.token_embedding = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> DiffCLIPTextModelOutput:
        text_outputs: BaseModelOutputWithPooling = self.text_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return DiffCLIPTextModelOutput(
            text_embeds=self.text_projection(text_outputs.pooler_output),
            last_hidden_state=text_outputs.last_hidden_state,
            hidden_states=text_outputs.hidden_states,
            attentions=text_outputs.attentions,
        )


class DiffCLIPVisionModelWithProjection(DiffCLIPPreTrainedModel):
    """The vision tower with its projection: `image_embeds` is the projected pooled output."""

    config_class = DiffCLIPVisionConfig
    base_model_prefix = "vision_model"
    main_input_name = "pixel_values"
    input_modalities = ("image",)

    def __init__(self, config: DiffCLIPVisionConfig):
        super().__init__(config)
        self.vision_model = DiffCLIPVisionModel._from_config(config)
        self.visual_projection = nn.Linear(config.hidden_size, config.projection_dim, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.vision_model.embeddings.patch_embedding

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> DiffCLIPVisionModelOutput:
        vision_outputs: BaseModelOutputWithPooling = self.vision_model(
            pixel_values=pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, **kwargs
        )
        return DiffCLIPVisionModelOutput(
            image_embeds=self.visual_projection(vision_outputs.pooler_output),
            last_hidden_state=vision_outputs.last_hidden_state,
            hidden_states=vision_outputs.hidden_states,
            attentions=vision_outputs.attentions,
        )


for _model_class in (
    DiffCLIPModel,
    DiffCLIPTextModel,
    DiffCLIPVisionModel,
    DiffCLIPTextModelWithProjection,
    DiffCLIPVisionModelWithProjection,
):
    _model_class.register_for_auto_class("AutoModel")

__all__ = [
    "DiffCLIPModel",
    "DiffCLIPPreTrainedModel",
    "DiffCLIPTextModel",
    "DiffCLIPTextModelWithProjection",
    "DiffCLIPVisionModel",
    "DiffCLIPVisionModelWithProjection",
]
