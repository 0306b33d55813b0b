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

This file imports only torch, transformers and `.configuration_diffclip`, so it ships as Hub remote code.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs, torch_int
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .configuration_diffclip import (
    DiffCLIPConfig,
    DiffCLIPTextConfig,
    DiffCLIPTowerConfig,
    DiffCLIPVisionConfig,
)


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
        position_embedding = self.position_embedding.weight.unsqueeze(0)
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


def attention_probabilities(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(Q·Kᵀ·scaling + mask) per head in float32, then attention dropout: `[B, heads, N, N]`."""
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return nn.functional.dropout(attn_weights, p=dropout, training=module.training)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention (CLIP's eager path): output `[B, N, heads, d_v]`, maps `[B, heads, N, N]`."""
    attn_weights = attention_probabilities(module, query, key, attention_mask, scaling, dropout)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


def eager_differential_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    lambda_full: torch.Tensor,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A1 − λ·A2)·V (DiffCLIP Eq. 3), written as the released code does it.

    `query`/`key` are `[B, H, N, d]` with heads (2m, 2m+1) holding (Q1, K1) and (Q2, K2) of differential head
    m, `value` is `[B, H/2, N, 2d]`. Returns the output `[B, N, H/2, 2d]` and the differential maps A1 − λ·A2
    `[B, H/2, N, N]` (what `output_attentions=True` returns; rows sum to 1 − λ and entries can be negative).
    """
    attn_weights = attention_probabilities(module, query, key, attention_mask, scaling, dropout).unflatten(
        1, (-1, 2)
    )
    diff_weights = attn_weights[:, :, 0] - lambda_full * attn_weights[:, :, 1]
    attn_output = torch.matmul(diff_weights, value).transpose(1, 2).contiguous()
    return attn_output, diff_weights


def paired_attention_forward(
    attention_interface: Callable,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    lambda_full: torch.Tensor,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, None]:
    """(A1 − λ·A2)·V = A1·V − λ·(A2·V) through any attention kernel (SDPA, ...).

    The output is linear in V, so one kernel call over all H heads, with both heads of a pair reading their
    shared value `[B, H/2, N, 2d]`, gives A1·V and A2·V side by side; subtracting is exact. (Concatenating
    [Q1; Q2] along the feature axis instead would compute softmax(Q1K1ᵀ + Q2K2ᵀ), a different map.) Same
    inputs and output as `eager_differential_attention_forward`; the kernel does not return maps.
    """
    paired_value = value.repeat_interleave(2, dim=1)
    attn_output, _ = attention_interface(
        module, query, key, paired_value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )
    attn_output = attn_output.unflatten(2, (-1, 2))
    return attn_output[..., 0, :] - lambda_full * attn_output[..., 1, :], None


class DiffCLIPRMSNorm(nn.Module):
    """RMSNorm over a differential head's 2·head_dim output, normalised in float32 then scaled by a learnable
    weight (the released DiffCLIP / unilm `RMSNorm`)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x.to(hidden_states.dtype) * self.weight


class DiffCLIPAttention(nn.Module):
    """Multi-head attention of one DiffCLIP layer: differential attention (DiffCLIP §3.2, Diff MHA) when
    `config.differential_attention`, else CLIP's attention. Biases on q/k/v/out as in CLIP."""

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

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[B, N, D]` -> `[B, N, D]` and the attention maps (eager only; differential maps A1 − λ·A2 when
        differential)."""
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        queries = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        keys = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        dropout = 0.0 if not self.training else self.dropout
        if self.differential:
            values = self.v_proj(hidden_states).view(*input_shape, -1, 2 * self.head_dim).transpose(1, 2)
            attn_output, attn_weights = self._differential(
                queries, keys, values, attention_mask, dropout, **kwargs
            )
        else:
            values = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
            attn_output, attn_weights = attention_interface(
                self, queries, keys, values, attention_mask, scaling=self.scale, dropout=dropout, **kwargs
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
        lambda_full = self.lambda_full().to(queries.dtype)
        implementation = self.config._attn_implementation
        if implementation == "eager":
            attn_output, attn_weights = eager_differential_attention_forward(
                self, queries, keys, values, attention_mask, self.scale, lambda_full, dropout, **kwargs
            )
        else:
            interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
            attn_output, attn_weights = paired_attention_forward(
                interface,
                self,
                queries,
                keys,
                values,
                attention_mask,
                self.scale,
                lambda_full,
                dropout,
                **kwargs,
            )
        return self.diff_norm(attn_output) * (1.0 - self.lambda_init), attn_weights


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


class DiffCLIPPreTrainedModel(PreTrainedModel):
    config: DiffCLIPConfig
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

    @torch.no_grad()
    def _init_weights(self, module):
        """CLIP's init, plus λ vectors ~ N(0, lambda_std) and RMSNorm weights 1 (the released DiffCLIP)."""
        super()._init_weights(module)
        factor = self.config.initializer_factor
        if isinstance(module, DiffCLIPTextEmbeddings):
            _init_child_weight(module.token_embedding, factor * 0.02)
            _init_child_weight(module.position_embedding, factor * 0.02)
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, DiffCLIPVisionEmbeddings):
            init.normal_(module.class_embedding, mean=0.0, std=module.embed_dim**-0.5 * factor)
            _init_child_weight(module.patch_embedding, module.config.initializer_range * factor)
            _init_child_weight(module.position_embedding, module.config.initializer_range * factor)
            init.copy_(module.position_ids, torch.arange(module.num_positions).expand((1, -1)))
        elif isinstance(module, DiffCLIPAttention):
            in_proj_std = (module.embed_dim**-0.5) * ((2 * module.config.num_hidden_layers) ** -0.5) * factor
            for child in (module.q_proj, module.k_proj, module.v_proj):
                _init_child_weight(child, in_proj_std)
            _init_child_weight(module.out_proj, (module.embed_dim**-0.5) * factor)
            if module.differential:
                for vector in (module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2):
                    init.normal_(vector, mean=0.0, std=module.config.lambda_std)
        elif isinstance(module, DiffCLIPRMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, DiffCLIPMLP):
            in_proj_std = (
                (module.config.hidden_size**-0.5) * ((2 * module.config.num_hidden_layers) ** -0.5) * factor
            )
            _init_child_weight(module.fc1, (2 * module.config.hidden_size) ** -0.5 * factor)
            _init_child_weight(module.fc2, in_proj_std)
        elif isinstance(module, DiffCLIPModel):
            _init_child_weight(module.text_projection, module.text_embed_dim**-0.5 * factor)
            _init_child_weight(module.visual_projection, module.vision_embed_dim**-0.5 * factor)
        elif isinstance(module, DiffCLIPVisionModelWithProjection):
            _init_child_weight(module.visual_projection, self.config.hidden_size**-0.5 * factor)
        elif isinstance(module, DiffCLIPTextModelWithProjection):
            _init_child_weight(module.text_projection, self.config.hidden_size**-0.5 * factor)


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

    config: DiffCLIPTextConfig
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
        """`pooler_output` is the final-LayerNorm state at the first EOS token (CLIP's pooling)."""
        if input_ids is None:
            raise ValueError("You have to specify input_ids")
        input_ids = input_ids.view(-1, input_ids.shape[-1])
        hidden_states = self.embeddings(input_ids=input_ids, position_ids=position_ids)
        attention_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            past_key_values=None,
        )
        kwargs.pop("is_causal", None)
        encoder_outputs = self.encoder(
            inputs_embeds=hidden_states, attention_mask=attention_mask, is_causal=True, **kwargs
        )
        last_hidden_state = self.final_layer_norm(encoder_outputs.last_hidden_state)
        ids = input_ids.to(dtype=torch.int, device=last_hidden_state.device)
        if self.eos_token_id == 2:
            # Legacy CLIP configs (before transformers PR #24773): the EOS token has the highest id.
            eos_positions = ids.argmax(dim=-1)
        else:
            is_eos = ids == self.eos_token_id
            if not torch.compiler.is_compiling() and not is_eos.any(dim=-1).all():
                raise ValueError(
                    f"A text has no EOS token (id {self.eos_token_id}), where the text embedding is pooled: "
                    "set text_config.eos_token_id to your tokenizer's EOS id and keep EOS when truncating."
                )
            eos_positions = is_eos.int().argmax(dim=-1)
        batch_index = torch.arange(last_hidden_state.shape[0], device=last_hidden_state.device)
        pooled_output = last_hidden_state[batch_index, eos_positions]
        return BaseModelOutputWithPooling(last_hidden_state=last_hidden_state, pooler_output=pooled_output)


class DiffCLIPVisionModel(DiffCLIPPreTrainedModel):
    """The DiffCLIP vision tower (ViT, class-token pooling) without projection."""

    config: DiffCLIPVisionConfig
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

    @classmethod
    def from_clip(cls, clip_model_or_path: Any, **kwargs: Any) -> "DiffCLIPModel":
        """Convert a transformers `CLIPModel` (or a path / Hub id of one) to DiffCLIP (needs `hf_vrl`).

        The differential branch is calibrated on real images and captions so that the model starts close to
        the CLIP: `calibration_data=` your images or dataset (default: the generated shapes world;
        `"synthetic"`: data-free), preprocessed with `image_processor=` / `tokenizer=` (default: those saved
        with a CLIP given as a path). `model.conversion_report` holds the mean cosine per tower between the
        DiffCLIP and CLIP embeddings on held-out calibration examples. Other keyword arguments: see
        `hf_vrl.methods.diffclip.convert.diffclip_from_clip` (key map, initialisation, config overrides).
        """
        try:
            from hf_vrl.methods.diffclip.convert import diffclip_from_clip
        except ImportError as error:
            raise ImportError(
                "DiffCLIPModel.from_clip needs the hf_vrl package: pip install hf-vrl"
            ) from error
        return diffclip_from_clip(clip_model_or_path, model_class=cls, **kwargs)

    @classmethod
    def from_official_checkpoint(cls, path: Any, **kwargs: Any) -> "DiffCLIPModel":
        """Load a released `hammh0a/DiffCLIP_*` `checkpoint_best.pt` safely (needs `hf_vrl`).

        See `hf_vrl.methods.diffclip.convert.diffclip_from_official_checkpoint`.
        """
        try:
            from hf_vrl.methods.diffclip.convert import diffclip_from_official_checkpoint
        except ImportError as error:
            raise ImportError(
                "DiffCLIPModel.from_official_checkpoint needs the hf_vrl package: pip install hf-vrl"
            ) from error
        return diffclip_from_official_checkpoint(path, model_class=cls, **kwargs)

    @can_return_tuple
    def get_text_features(
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
    def get_image_features(
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
        vision_outputs = self.get_image_features(
            pixel_values=pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, **kwargs
        )
        text_outputs = self.get_text_features(
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

    config: DiffCLIPTextConfig
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

    config: DiffCLIPVisionConfig
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
