"""The frozen diffusion side of DCR: SD UNet eps_theta, VAE, DDPM forward process, empty-prompt embedding.

DCR keeps the generative model frozen (§4.2, "Training Protocol"). Loads any SD-1.x/2.x pipeline folder or Hub
id in diffusers layout (`unet/`, `vae/`, `scheduler/`, `text_encoder/`, `tokenizer/`). The paper's backbone is
SD-2.1-base; Stability AI took `stabilityai/stable-diffusion-2-1-base` offline in Nov 2025, so use a mirror
such as `Manojb/stable-diffusion-2-1-base` (the one the official README names) or a local copy.
"""

from __future__ import annotations

import contextlib
import logging
import math
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

from hf_vrl.devices import module_device, module_dtype
from hf_vrl.methods.dcr.lean_unet import lean_unet
from hf_vrl.methods.dcr.memory import choose_chunk_size, free_memory, measure_pair_memory
from hf_vrl.methods.dcr.unet_split import SplitUNet

logger = logging.getLogger(__name__)

PREDICTION_TARGETS = ("epsilon", "v_prediction", "scheduler")
RECOMPUTE_MODES = ("pointwise", "selective", "chunks")
CHECKPOINTING_MODES = ("none", "blocks", "feedforward", *RECOMPUTE_MODES)
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
_DTYPES |= {"float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`"bf16"`/`"bfloat16"`/`"fp16"`/`"float16"`/`"fp32"`/`"float32"` or a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def sd_ddpm_scheduler(**overrides):
    """The DDPM scheduler SD was trained with (official code: 1000 steps, scaled_linear 0.00085 -> 0.012)."""
    from diffusers import DDPMScheduler

    settings = (
        dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
        | overrides
    )
    return DDPMScheduler(**settings)


def _cast(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    return module if next(module.parameters()).dtype == dtype else module.to(dtype)


class FrozenDiffusion(nn.Module):
    """Frozen SD UNet + VAE in reduced precision, the DDPM forward process and the empty-prompt embedding.

    Not part of the saved model: the trainer keeps it outside `DCRModel`. `train()` never unfreezes it.

    Speed and memory of the B^2+B UNet passes (none changes a result beyond floating-point rounding):
    reuse_prefix: run the UNet up to its first cross-attention once per noisy latent and continue from there
        for each of its conditions (`unet_split.SplitUNet`); UNets it cannot split run whole passes.
    compile_unet: `torch.compile` the per-chunk UNet work (and the prefix).
    unet_autocast: let a surrounding autocast (the Trainer's bf16/fp16) reach into the UNet. Off by default:
        the UNet runs in its own `dtype`, as SD pipelines run it. On CUDA, autocast runs GroupNorm and
        LayerNorm in fp32 on fp32 copies of their inputs, and the backward pass keeps those copies and the
        fp32 SiLU inputs after them: 1.34x what the bf16 UNet keeps at SD-2.1 size (benchmarks/dcr_step.py
        --real-unet-memory).
    lean_activations: keep only what the backward pass to the condition needs (`lean_unet`: no convolution
        inputs, norm + SiLU and GEGLU's gelu recomputed; bit-identical results, no extra matmul FLOPs).
        Applies outside autocast and with gradient_checkpointing none, blocks, feedforward or chunks.
    gradient_checkpointing: what the backward pass recomputes instead of keeping, from most kept to least.
        "none"; "feedforward" (the lean UNet whatever `lean_activations`, and each GEGLU's input projection
        recomputed: two thirds of what a lean pass keeps, for 7 % more UNet FLOPs at SD-2.1 size);
        "pointwise" (each UNet call's norms, activations and element-wise ops; the outputs of
        convolutions, linear layers and attention are kept: no extra FLOPs); "selective" (the linear layers
        too; convolution and attention outputs kept: recomputes about a third of the forward FLOPs);
        "chunks" (each UNet call whole); "blocks" (diffusers' per-block checkpointing, every block whole).
    """

    def __init__(
        self,
        unet: nn.Module,
        vae: nn.Module,
        scheduler,
        null_text_embeds: torch.Tensor,
        dtype: str | torch.dtype = torch.float32,
        gradient_checkpointing: str = "none",
        reuse_prefix: bool = True,
        compile_unet: bool = False,
        unet_autocast: bool = False,
        lean_activations: bool = True,
    ):
        super().__init__()
        if gradient_checkpointing not in CHECKPOINTING_MODES:
            raise ValueError(
                f"gradient_checkpointing must be one of {CHECKPOINTING_MODES}, got {gradient_checkpointing!r}"
            )
        dtype = resolve_dtype(dtype)
        self.unet = _cast(unet, dtype).requires_grad_(False).eval()
        feedforward = gradient_checkpointing == "feedforward"
        if feedforward or (lean_activations and gradient_checkpointing not in _KEPT_OUTPUTS):
            self.unet = lean_unet(self.unet, recompute_feedforward=feedforward)
        self.vae = _cast(vae, dtype).requires_grad_(False).eval()
        self.scheduler = scheduler
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing == "blocks":
            self.unet.enable_gradient_checkpointing()
        self.unet_autocast = unet_autocast
        self.register_buffer("null_text_embeds", null_text_embeds.detach().float().clone(), persistent=False)
        self.split = self._split(reuse_prefix)
        self.compile_unet = compile_unet
        self._run = torch.compile(self._chunk) if compile_unet else self._chunk
        self._prefix = None
        if self.split is not None:
            self._prefix = torch.compile(self.split.prefix) if compile_unet else self.split.prefix
        self._chunk_sizes: dict[tuple, int | None] = {}

    def _split(self, reuse_prefix: bool) -> SplitUNet | None:
        if not reuse_prefix:
            return None
        reason = SplitUNet.unsupported_reason(self.unet)
        if reason:
            logger.warning("reuse_prefix: %s; every UNet pass runs whole", reason)
            return None
        return SplitUNet(self.unet)

    def train(self, mode: bool = True) -> FrozenDiffusion:
        """Stay in eval mode: the generative model is frozen (no dropout, no norm-statistics updates)."""
        return super().train(False)

    @property
    def dtype(self) -> torch.dtype:
        return module_dtype(self.unet)

    @property
    def device(self) -> torch.device:
        return module_device(self.unet)

    @property
    def num_train_timesteps(self) -> int:
        return self.scheduler.config.num_train_timesteps

    @property
    def prediction_type(self) -> str:
        """What the scheduler (hence the UNet) is parameterised to predict."""
        return self.scheduler.config.prediction_type

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """VAE latents x~ = Enc(x) * scaling_factor of images in [0, 1], at the resolution given (the CLIP
        one); on the VAE's device, float32."""
        pixels = (images * 2.0 - 1.0).to(module_device(self.vae), module_dtype(self.vae))
        posterior = self.vae.encode(pixels).latent_dist
        return posterior.sample().float() * self.vae.config.scaling_factor

    def sample_timesteps(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """t ~ U{0, ..., T-1}, one per image (Algorithm 1, line 5)."""
        return torch.randint(0, self.num_train_timesteps, (batch_size,), device=device)

    def add_noise(self, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(a_bar_t) x~ + sqrt(1 - a_bar_t) eps (Algorithm 1, line 7): the scheduler's own
        `add_noise`."""
        return self.scheduler.add_noise(latents, noise, timesteps)

    def target(
        self, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor, kind: str
    ) -> torch.Tensor:
        """The ground-truth "eps_gt" of Eq. 12.

        `"epsilon"`: the noise (paper); `"v_prediction"`: sqrt(a_bar) eps - sqrt(1 - a_bar) x~ (official code,
        whatever the UNet's parameterisation; the scheduler's `get_velocity`); `"scheduler"`: whatever the
        scheduler's `prediction_type` says.
        """
        if kind == "scheduler":
            kind = {"epsilon": "epsilon", "v_prediction": "v_prediction", "sample": "sample"}[
                self.prediction_type
            ]
        if kind == "epsilon":
            return noise
        if kind == "v_prediction":
            return self.scheduler.get_velocity(latents, noise, timesteps)
        if kind == "sample":
            return latents
        raise ValueError(f"target must be one of {PREDICTION_TARGETS}, got {kind!r}")

    def predict(
        self,
        noisy: torch.Tensor,
        timesteps: torch.Tensor,
        conditions: torch.Tensor,
        latent_index: torch.Tensor | None = None,
        condition_index: torch.Tensor | None = None,
        chunk_size: int | str | None = None,
    ) -> torch.Tensor:
        """eps_theta(x_t[latent_index], t[latent_index], c[condition_index]) for every pair, in chunks, fp32
        out, on the UNet's device.

        With indices, pair k pairs latent `latent_index[k]` with condition `condition_index[k]` (DCR's B^2
        grid); without, latent k is paired with condition k. `chunk_size` bounds the UNet batch (None: one
        call; "auto": chosen from the free CUDA memory, `resolve_chunk_size`).
        """
        device, dtype = self.device, self.dtype
        noisy, timesteps, conditions = (
            noisy.to(device, dtype),
            timesteps.to(device),
            conditions.to(device, dtype),
        )
        if latent_index is None:
            latent_index = torch.arange(len(noisy), device=device)
        if condition_index is None:
            condition_index = latent_index
        latent_index, condition_index = latent_index.to(device), condition_index.to(device)
        if latent_index.shape != condition_index.shape:
            raise ValueError("latent_index and condition_index must have the same length")
        with self._precision():
            prefix = None
            if self.split is not None:
                with torch.no_grad():
                    prefix = self._prefix(noisy, timesteps)
            total = len(latent_index)
            size = self.resolve_chunk_size(
                chunk_size, prefix, noisy, timesteps, conditions, latent_index, condition_index
            )
            size = size or total
            outputs = [
                self._run(
                    prefix,
                    noisy,
                    timesteps,
                    conditions,
                    latent_index[start : start + size],
                    condition_index[start : start + size],
                )
                for start in range(0, total, size)
            ]
        return torch.cat(outputs).float()

    def _precision(self) -> contextlib.AbstractContextManager:
        """The UNet in its own dtype: any surrounding autocast off (unless `unet_autocast`)."""
        device_type = self.device.type
        if self.unet_autocast or not torch.amp.is_autocast_available(device_type):
            return contextlib.nullcontext()
        return torch.autocast(device_type, enabled=False)

    def _pairs(self, prefix, noisy, timesteps, conditions, latent_index, condition_index) -> torch.Tensor:
        """One UNet call over the pairs: from the shared prefix when there is one, else whole passes."""
        cond = conditions[condition_index]
        if prefix is None:
            return self.unet(noisy[latent_index], timesteps[latent_index], encoder_hidden_states=cond).sample
        return self.split.suffix(prefix.select(latent_index), cond)

    def _chunk(self, prefix, noisy, timesteps, conditions, latent_index, condition_index) -> torch.Tensor:
        """`_pairs`, under `torch.utils.checkpoint` in the recompute modes (whole, or with a keep policy)."""
        args = (prefix, noisy, timesteps, conditions, latent_index, condition_index)
        if self.gradient_checkpointing not in RECOMPUTE_MODES or not (
            torch.is_grad_enabled() and conditions.requires_grad
        ):
            return self._pairs(*args)
        mode = self.gradient_checkpointing
        context = _recompute_policy(mode) if mode in _KEPT_OUTPUTS else noop_context_fn
        return checkpoint(self._pairs, *args, use_reentrant=False, context_fn=context)

    def resolve_chunk_size(
        self, chunk_size, prefix, noisy, timesteps, conditions, latent_index, condition_index
    ) -> int | None:
        """`chunk_size` itself (a positive int or None), or for "auto" the size `memory.choose_chunk_size`
        picks from the device's free memory and a two-pass probe of the per-pass memory (once per grid shape;
        None where no free-memory figure exists, e.g. on the CPU)."""
        if chunk_size != "auto":
            if chunk_size is not None and (
                isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0
            ):
                raise ValueError(
                    f"unet_chunk_size must be a positive int, None or 'auto', got {chunk_size!r}"
                )
            return chunk_size
        key = (len(latent_index), tuple(noisy.shape), tuple(conditions.shape), self.gradient_checkpointing)
        if key not in self._chunk_sizes:
            free = free_memory(self.device)
            size = None
            if free is not None:
                probe = (latent_index[:2], condition_index[:2])
                kept, transient = measure_pair_memory(
                    lambda cond: self._chunk(prefix, noisy, timesteps, cond, *probe),
                    conditions,
                    passes=len(probe[0]),
                )
                size = choose_chunk_size(len(latent_index), kept, transient, free)
            logger.info("unet_chunk_size auto: %s UNet passes per call", size or len(latent_index))
            self._chunk_sizes[key] = size
        return self._chunk_sizes[key]


def _aten_ops(*names: str) -> frozenset:
    return frozenset(getattr(torch.ops.aten, name).default for name in names if hasattr(torch.ops.aten, name))


_ATTENTION_OPS = _aten_ops(
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "bmm",  # the math attention path (and diffusers' baddbmm processor)
    "baddbmm",
)
# What each recompute mode keeps from the forward pass; everything else is recomputed in backward.
_KEPT_OUTPUTS = {
    "selective": _ATTENTION_OPS | _aten_ops("convolution"),
    "pointwise": _ATTENTION_OPS | _aten_ops("convolution", "mm", "addmm"),
}


def _recompute_policy(mode: str):
    kept = _KEPT_OUTPUTS[mode]

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in kept else CheckpointPolicy.PREFER_RECOMPUTE

    return partial(create_selective_checkpoint_contexts, policy)


@torch.no_grad()
def empty_prompt_embedding(
    pretrained: str | Path, device: str | torch.device = "cpu", attention_mask: bool = True
) -> torch.Tensor:
    """The SD text encoder's last hidden state for the empty prompt `[1, T, D]`, padded to the context
    length T (the official `uc`); computed once.

    `attention_mask=True` (official DCR code): the tokenizer's mask goes to the text encoder, so the padding
    positions 2..T-1 attend only to BOS/EOS. `False`: no mask, every position attends to all earlier ones,
    padding included (what SD pipelines do for their unconditional embedding). BOS and EOS come out the same
    either way; the padding positions differ.
    """
    from transformers import AutoTokenizer, CLIPTextModel

    from hf_vrl.weights import load_pretrained

    tokenizer = AutoTokenizer.from_pretrained(str(pretrained), subfolder="tokenizer")
    text_encoder = load_pretrained(
        CLIPTextModel, str(pretrained), extra_allowed=True, subfolder="text_encoder", dtype=torch.float32
    ).to(device)
    max_length = min(tokenizer.model_max_length, text_encoder.config.max_position_embeddings)
    tokens = tokenizer(
        [""], padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
    )
    mask = tokens.attention_mask.to(device) if attention_mask else None
    return text_encoder(input_ids=tokens.input_ids.to(device), attention_mask=mask).last_hidden_state


def load_diffusion(
    pretrained: str | Path,
    dtype: str | torch.dtype = "bfloat16",
    gradient_checkpointing: str = "none",
    device: str | torch.device = "cpu",
    empty_prompt_mask: bool = True,
    reuse_prefix: bool = True,
    compile_unet: bool = False,
    unet_autocast: bool = False,
    lean_activations: bool = True,
) -> FrozenDiffusion:
    """Load a frozen SD-1.x/2.x pipeline (Hub id or local dir) for DCR.

    UNet and VAE go to `dtype` (bf16 by default, as the official code; the trained encoder stays fp32). The
    DDPM scheduler is built from the pipeline's `scheduler/` config (betas and `prediction_type`), falling
    back to SD's standard schedule when the folder has none. The text encoder is used once for the empty
    prompt (`empty_prompt_embedding`, with its attention mask unless `empty_prompt_mask=False`), then dropped.
    `gradient_checkpointing`, `reuse_prefix`, `compile_unet`, `unet_autocast`, `lean_activations`: see
    `FrozenDiffusion`.
    """
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel

    pretrained = str(pretrained)
    dtype = resolve_dtype(dtype)
    unet = UNet2DConditionModel.from_pretrained(pretrained, subfolder="unet", dtype=dtype)
    vae = AutoencoderKL.from_pretrained(pretrained, subfolder="vae", dtype=dtype)
    try:
        scheduler = DDPMScheduler.from_pretrained(pretrained, subfolder="scheduler")
    except OSError:
        logger.warning("%s has no scheduler/ config: using SD's standard DDPM schedule (epsilon)", pretrained)
        scheduler = sd_ddpm_scheduler()
    null = empty_prompt_embedding(pretrained, device, attention_mask=empty_prompt_mask)
    diffusion = FrozenDiffusion(
        unet,
        vae,
        scheduler,
        null,
        dtype,
        gradient_checkpointing,
        reuse_prefix,
        compile_unet,
        unet_autocast,
        lean_activations,
    )
    return diffusion.to(device)


def tiny_diffusion(
    save_dir: str | Path,
    image_size: int = 16,
    cross_attention_dim: int = 16,
    block_out_channels: tuple[int, ...] = (8, 16),
    vae_block_out_channels: tuple[int, ...] | None = None,
    text_encoder: str | Path | None = None,
    text_context_length: int = 77,
    prediction_type: str = "epsilon",
    seed: int = 0,
) -> Path:
    """Write a tiny random SD-style pipeline folder (diffusers `get_dummy_components` style) and return its
    path.

    Loading it with `load_diffusion(save_dir)` exercises exactly the code path of a real SD checkpoint. The
    VAE (`vae_block_out_channels`, default `block_out_channels`) downsamples by 2 per extra block and its
    posterior log-variance is pinned to -10 so the random encoder is near-deterministic. `text_encoder` (a
    CLIP checkpoint) supplies the text tower and tokenizer, as SD's comes from CLIP; by default a 1-layer
    random one.
    """
    from diffusers import AutoencoderKL, UNet2DConditionModel

    save_dir = Path(save_dir)
    vae_channels = vae_block_out_channels or block_out_channels
    groups = min(math.gcd(*block_out_channels, *vae_channels), 4)
    latent_size = image_size // 2 ** (len(vae_channels) - 1)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        text_model, tokenizer = _tiny_text_encoder(text_encoder, cross_attention_dim, text_context_length)
        unet = UNet2DConditionModel(
            sample_size=latent_size,
            in_channels=4,
            out_channels=4,
            block_out_channels=block_out_channels,
            layers_per_block=1,
            down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (len(block_out_channels) - 1),
            up_block_types=("CrossAttnUpBlock2D",) * (len(block_out_channels) - 1) + ("UpBlock2D",),
            cross_attention_dim=text_model.config.hidden_size,
            attention_head_dim=max(1, block_out_channels[-1] // 4),
            norm_num_groups=groups,
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * len(vae_channels),
            up_block_types=("UpDecoderBlock2D",) * len(vae_channels),
            block_out_channels=vae_channels,
            latent_channels=4,
            norm_num_groups=groups,
            sample_size=image_size,
        )
    with torch.no_grad():
        vae.quant_conv.weight[4:].zero_()  # output channels 4..7 are the posterior log-variance
        vae.quant_conv.bias[4:].fill_(-10.0)
    unet.save_pretrained(save_dir / "unet")
    vae.save_pretrained(save_dir / "vae")
    sd_ddpm_scheduler(prediction_type=prediction_type).save_pretrained(save_dir / "scheduler")
    text_model.save_pretrained(save_dir / "text_encoder")
    tokenizer.save_pretrained(save_dir / "tokenizer")
    return save_dir


def _tiny_text_encoder(source: str | Path | None, width: int, context_length: int) -> tuple:
    """(CLIPTextModel, tokenizer): from a CLIP checkpoint, or a random 1-layer one knowing only BOS/EOS."""
    from transformers import AutoTokenizer, CLIPModel, CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    if source is not None:
        text_model = CLIPModel.from_pretrained(str(source)).text_model
        return text_model, AutoTokenizer.from_pretrained(str(source))
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}  # the empty prompt needs only BOS and EOS (= pad)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=context_length)
    config = CLIPTextConfig(
        vocab_size=len(vocab),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=context_length,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    return CLIPTextModel(config), tokenizer
