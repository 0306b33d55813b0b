"""A Stable Diffusion UNet split at its first cross-attention, so the condition-independent prefix runs once.

DCR evaluates eps_theta(x_t^i, t_i, c_j) for one noisy latent i under B+1 conditions j (Algorithm 1, line 10).
Everything the UNet computes before its first cross-attention reads only (x_t^i, t_i): the time embedding,
`conv_in`, the down blocks without cross-attention, the resnet in front of the first transformer and, inside
that transformer's first block, the input norm/projection, the self-attention and the norm feeding the
cross-attention. `SplitUNet.prefix` computes that once per latent; `SplitUNet.suffix` continues from it for
any (latent, condition) pairing. Composed, they are the UNet's own forward (the same modules in the same
order; `tests/methods/test_dcr_unet_split.py` checks outputs and condition gradients against `unet(...)`).

Supported: `UNet2DConditionModel` in the SD-1.x/2.x layout (down blocks `DownBlock2D`/`CrossAttnDownBlock2D`,
continuous `Transformer2DModel`s with layer-norm `BasicTransformerBlock`s; conv or linear projections); no
class/addition embeddings. `SplitUNet.supports(unet)` says whether a UNet qualifies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass
class UNetPrefix:
    """The prefix state of each noisy latent `[L, ...]`: time embedding, skip connections so far, the first
    transformer's input (its residual), its token stream after self-attention and that stream's norm2."""

    emb: torch.Tensor
    skips: tuple[torch.Tensor, ...]
    transformer_input: torch.Tensor
    tokens: torch.Tensor
    query_input: torch.Tensor

    def select(self, index: torch.Tensor) -> UNetPrefix:
        """The state of latents `index` (one row per UNet pass)."""
        return UNetPrefix(
            emb=self.emb[index],
            skips=tuple(skip[index] for skip in self.skips),
            transformer_input=self.transformer_input[index],
            tokens=self.tokens[index],
            query_input=self.query_input[index],
        )


def _first_cross_attention_block(unet: nn.Module) -> int | None:
    for index, block in enumerate(unet.down_blocks):
        if getattr(block, "has_cross_attention", False):
            return index
    return None


class SplitUNet:
    """`unet(sample, t, c)` as `suffix(prefix(sample, t).select(i), c)` (module docstring). Holds no weights
    of its own: it calls the UNet's modules."""

    def __init__(self, unet: nn.Module):
        reason = self.unsupported_reason(unet)
        if reason:
            raise ValueError(f"cannot split this UNet at its first cross-attention: {reason}")
        self.unet = unet
        self.split = _first_cross_attention_block(unet)

    @staticmethod
    def unsupported_reason(unet: nn.Module) -> str | None:
        """Why `unet` cannot be split (None when it can)."""
        from diffusers import UNet2DConditionModel
        from diffusers.models.attention import BasicTransformerBlock
        from diffusers.models.transformers.transformer_2d import Transformer2DModel
        from diffusers.models.unets.unet_2d_blocks import CrossAttnDownBlock2D

        if not isinstance(unet, UNet2DConditionModel):
            return f"{type(unet).__name__} is not a UNet2DConditionModel"
        config = unet.config
        if unet.class_embedding is not None or config.addition_embed_type is not None:
            return "class/addition embeddings are not supported"
        if config.center_input_sample or config.time_cond_proj_dim is not None or unet.encoder_hid_proj:
            return "center_input_sample / time_cond_proj / encoder_hid_proj are not supported"
        split = _first_cross_attention_block(unet)
        if split is None:
            return "it has no cross-attention down block"
        block = unet.down_blocks[split]
        if not isinstance(block, CrossAttnDownBlock2D):
            return f"its first cross-attention block is a {type(block).__name__}"
        transformer = block.attentions[0]
        if not isinstance(transformer, Transformer2DModel) or not transformer.is_input_continuous:
            return "its first attention is not a continuous Transformer2DModel"
        first = transformer.transformer_blocks[0]
        if not isinstance(first, BasicTransformerBlock) or first.norm_type != "layer_norm":
            return "its first transformer block is not a layer-norm BasicTransformerBlock"
        if first.pos_embed is not None or first.only_cross_attention or first.attn2 is None:
            return "its first transformer block has positional embeddings or no separate cross-attention"
        if first._chunk_size is not None or hasattr(first, "fuser"):
            return "chunked feed-forward / GLIGEN are not supported"
        return None

    @classmethod
    def supports(cls, unet: nn.Module) -> bool:
        return cls.unsupported_reason(unet) is None

    @property
    def _block(self) -> nn.Module:
        return self.unet.down_blocks[self.split]

    @property
    def _transformer(self) -> nn.Module:
        return self._block.attentions[0]

    def prefix(self, sample: torch.Tensor, timesteps: torch.Tensor) -> UNetPrefix:
        """Everything before the first cross-attention, once per latent (`sample [L, 4, h, w]`, `t [L]`)."""
        unet = self.unet
        emb = unet.time_embedding(unet.get_time_embed(sample=sample, timestep=timesteps), None)
        if unet.time_embed_act is not None:
            emb = unet.time_embed_act(emb)
        hidden = unet.conv_in(sample)
        skips = (hidden,)
        for block in unet.down_blocks[: self.split]:
            hidden, res = block(hidden_states=hidden, temb=emb)
            skips += res
        hidden = self._block.resnets[0](hidden, emb)
        tokens, _ = self._transformer._operate_on_continuous_inputs(hidden)
        first = self._transformer.transformer_blocks[0]
        tokens = first.attn1(first.norm1(tokens)) + tokens
        return UNetPrefix(emb, skips, hidden, tokens, first.norm2(tokens))

    def _first_transformer(self, state: UNetPrefix, conditions: torch.Tensor) -> torch.Tensor:
        """The rest of the first Transformer2DModel: cross-attention on, then its output projection."""
        transformer = self._transformer
        first = transformer.transformer_blocks[0]
        tokens = first.attn2(state.query_input, encoder_hidden_states=conditions) + state.tokens
        tokens = first.ff(first.norm3(tokens)) + tokens
        for block in transformer.transformer_blocks[1:]:
            tokens = block(tokens, encoder_hidden_states=conditions)
        batch, _, height, width = state.transformer_input.shape
        return transformer._get_output_for_continuous_inputs(
            tokens, state.transformer_input, batch, height, width, tokens.shape[-1]
        )

    def _split_block(self, state: UNetPrefix, conditions: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """The rest of the down block holding the first cross-attention (`CrossAttnDownBlock2D.forward`)."""
        block = self._block
        hidden = self._first_transformer(state, conditions)
        res = (hidden,)
        for resnet, attn in zip(block.resnets[1:], block.attentions[1:]):
            hidden = resnet(hidden, state.emb)
            hidden = attn(hidden, encoder_hidden_states=conditions, return_dict=False)[0]
            res += (hidden,)
        for downsampler in block.downsamplers or ():
            hidden = downsampler(hidden)
        if block.downsamplers is not None:
            res += (hidden,)
        return hidden, res

    def suffix(self, state: UNetPrefix, conditions: torch.Tensor) -> torch.Tensor:
        """The UNet from its first cross-attention on, for `state` (one row per pass) and `conditions [N, T,
        D]` (as `UNet2DConditionModel.forward` from there)."""
        unet, emb = self.unet, state.emb
        if torch.is_grad_enabled() and self._block.gradient_checkpointing:
            hidden, res = checkpoint(self._split_block, state, conditions, use_reentrant=False)
        else:
            hidden, res = self._split_block(state, conditions)
        skips = state.skips + res
        for block in unet.down_blocks[self.split + 1 :]:
            if getattr(block, "has_cross_attention", False):
                hidden, res = block(hidden_states=hidden, temb=emb, encoder_hidden_states=conditions)
            else:
                hidden, res = block(hidden_states=hidden, temb=emb)
            skips += res
        if unet.mid_block is not None:
            if getattr(unet.mid_block, "has_cross_attention", False):
                hidden = unet.mid_block(hidden, emb, encoder_hidden_states=conditions)
            else:
                hidden = unet.mid_block(hidden, emb)
        return self._up(hidden, emb, skips, conditions)

    def _up(self, hidden, emb, skips, conditions) -> torch.Tensor:
        unet = self.unet
        factor = 2**unet.num_upsamplers
        forward_upsample_size = any(dim % factor != 0 for dim in skips[0].shape[-2:])
        upsample_size = None
        for index, block in enumerate(unet.up_blocks):
            res, skips = skips[-len(block.resnets) :], skips[: -len(block.resnets)]
            if index < len(unet.up_blocks) - 1 and forward_upsample_size:
                upsample_size = skips[-1].shape[2:]
            kwargs = dict(
                hidden_states=hidden, temb=emb, res_hidden_states_tuple=res, upsample_size=upsample_size
            )
            if getattr(block, "has_cross_attention", False):
                kwargs["encoder_hidden_states"] = conditions
            hidden = block(**kwargs)
        if unet.conv_norm_out:
            hidden = unet.conv_act(unet.conv_norm_out(hidden))
        return unet.conv_out(hidden)

    def __call__(
        self, sample: torch.Tensor, timesteps: torch.Tensor, conditions: torch.Tensor
    ) -> torch.Tensor:
        """The plain forward through prefix and suffix: `unet(sample, t, c).sample`."""
        return self.suffix(self.prefix(sample, timesteps), conditions)
