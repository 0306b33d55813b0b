"""The memory one DCR training step asks of a GPU, predicted from its parts at the real size in seconds.

The preset's models are built from their real configurations (`hf_vrl.run.real_models`) with fake tensors
(`torch._subclasses.FakeTensorMode`: shapes, dtypes and storages without memory or arithmetic), and the parts
of a step run on them under the run's autocast, counted by `LiveMemory` as the dry run counts a real step:
  W  weights and buffers (the trained tower fp32, the frozen UNet / VAE in diffusion_dtype), G the gradients
     of what the stage trains, Z = 2G AdamW's two moments (created inside the first optimiser step: its peak)
  T  what the encoder's forward over the step's views (2B: clean and augmented) keeps for its backward
     (stage 1: the projector's; the tower is frozen), with or without the tower's gradient checkpointing
  U  the UNet grid: P passes (B^2 + B for Eq. 12) x what one pass keeps + C x what one pass adds in its
     backward (C the passes of one call, `unet_chunk_size`; all P in one call by default, and for "auto",
     which depends on the free memory: an upper bound), both measured on two passes with the stage's
     gradient_checkpointing (`memory.measure_pair_memory`)
  D  the micro-batch of float32 images
and the peak is W + G + Z + max(T + U + D, Z): bytes the CUDA allocator is asked for, without its caching
slack or the CUDA context. Attention is the CPU's flash kernel (what the dry run measured; a GPU's flash /
memory-efficient kernels keep the same output and log-sum-exp). Checked against the dry runs' measured steps
(`benchmarks/results/dry_runs.json`, tests/run/test_memory_budgets.py): the activations within 0.2 % of every
DCR preset's steps at micro-batches 1-3, both stages; the weights, gradients and AdamW state within 0.7 % of
what stayed allocated.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from hf_vrl.methods.dcr.diffusion import FrozenDiffusion, sd_ddpm_scheduler
from hf_vrl.methods.dcr.memory import LiveMemory, measure_pair_memory
from hf_vrl.methods.dcr.trainer import LoraSettings, prepare_stage
from hf_vrl.models.dcr import DCRModel
from hf_vrl.models.dcr.configuration_dcr import DCRConfig
from hf_vrl.run.real_models import build_architecture, catalogue

__all__ = ["Footprint", "predict_step", "unet_passes"]

GIB = 2**30
TRAINED = {"stage1": "projector", "stage2": "encoder", "end_to_end": "end_to_end"}  # as DCRMethod trains
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Footprint:
    """One stage's step at micro-batch `micro_batch`, in bytes (the module docstring)."""

    stage: str
    micro_batch: int
    weights: int
    gradients: int
    tower: int
    passes: int
    pass_kept: int
    pass_transient: int
    chunk: int
    data: int

    @property
    def optimizer_state(self) -> int:
        return 2 * self.gradients

    @property
    def activations(self) -> int:
        return self.tower + self.passes * self.pass_kept + self.chunk * self.pass_transient

    @property
    def peak(self) -> int:
        static = self.weights + self.gradients + self.optimizer_state
        return static + max(self.activations + self.data, self.optimizer_state)

    def report(self) -> dict[str, Any]:
        """The figures in GiB (4 places) beside the pass counts."""
        figures = asdict(self) | {
            "optimizer_state": self.optimizer_state,
            "activations": self.activations,
            "peak": self.peak,
        }
        counts = ("stage", "micro_batch", "passes", "chunk")
        return {key: value if key in counts else round(value / GIB, 4) for key, value in figures.items()}


def unet_passes(settings: Any, batch: int) -> int:
    """UNet passes of a step: Eq. 12's B x B grid (B x (1 + K) with K sampled negatives) plus the B
    positives; B for the reconstruction and joint objectives."""
    if settings.objective != "dcr":
        return batch
    width = batch if settings.num_negatives is None else min(batch, 1 + settings.num_negatives)
    return batch * width + batch


def predict_step(config: Any, stage: str, micro_batch: int | None = None) -> Footprint:
    """The `Footprint` of `stage` of a DCR run configuration at `micro_batch` (default its own), for models
    named by a Hub id hf_vrl has the real configuration of (`ValueError` otherwise)."""
    known = catalogue()
    for name, repo in (("model.clip", config.model.clip), ("dcr.diffusion", config.dcr.diffusion)):
        if repo not in known:
            raise ValueError(f"{name} {repo!r} has no real-size configuration in hf_vrl.run.real_configs")
    batch = micro_batch or config.optim.batch_size
    dcr = config.dcr
    views = 1 if dcr.objective == "reconstruction" else 2
    tower = _Tower(
        config.model.clip,
        dcr.diffusion,
        config.model.condition_mode,
        config.model.patch_token_ratio,
        (dcr.lora_r, dcr.lora_alpha, dcr.lora_dropout, dcr.lora_bias),
        TRAINED[stage],
        dcr.encoder_gradient_checkpointing and TRAINED[stage] != "projector",
        config.precision,
    )
    size = tower.image_size()
    unet = _UNet(
        dcr.diffusion,
        dcr.diffusion_dtype,
        dcr.gradient_checkpointing,
        dcr.reuse_prefix,
        dcr.unet_autocast,
        dcr.lean_activations,
    )
    weights, gradients = tower.weights()
    unet_weights, kept, transient = unet.measure(size // 8)
    passes = unet_passes(dcr, batch)
    chunk = dcr.unet_chunk_size
    return Footprint(
        stage=stage,
        micro_batch=batch,
        weights=weights + unet_weights,
        gradients=gradients,
        tower=tower.activations(views * batch),
        passes=passes,
        pass_kept=kept,
        pass_transient=transient,
        chunk=min(chunk, passes) if isinstance(chunk, int) else passes,
        data=batch * 3 * size * size * 4,
    )


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


@dataclass(frozen=True)
class _UNet:
    """The frozen diffusion side of a configuration (hashable: its measurements are cached)."""

    repo: str
    dtype: str
    checkpointing: str
    reuse_prefix: bool
    autocast: bool
    lean: bool

    def build(self) -> FrozenDiffusion:
        """At real size on the meta device."""
        pipeline = catalogue()[self.repo]["folders"]
        with torch.device("meta"):
            unet = build_architecture(pipeline["unet"]["config.json"])
            vae = build_architecture(pipeline["vae"]["config.json"])
            null = torch.zeros(1, _context(self.repo), unet.config.cross_attention_dim)
            return FrozenDiffusion(
                unet,
                vae,
                sd_ddpm_scheduler(),
                null,
                self.dtype,
                self.checkpointing,
                self.reuse_prefix,
                unet_autocast=self.autocast,
                lean_activations=self.lean,
            )

    @functools.cache  # noqa: B019 (a few configurations per process, each measured once)
    def measure(self, latent: int) -> tuple[int, int, int]:
        """(bytes of the weights and buffers, kept, transient bytes of one UNet pass of the grid at `latent`
        x `latent`, as `FrozenDiffusion.predict` runs it: two passes measured on fake tensors)."""
        diffusion = self.build()
        weights = _bytes([*diffusion.parameters(), *diffusion.buffers()])
        width = diffusion.unet.config.cross_attention_dim
        with FakeTensorMode():
            _fake(diffusion)
            noisy = torch.randn(1, 4, latent, latent, dtype=diffusion.dtype)
            timesteps = torch.randint(0, diffusion.num_train_timesteps, (1,))
            conditions = torch.randn(2, _context(self.repo), width, dtype=diffusion.dtype)
            latent_index, condition_index = torch.zeros(2, dtype=torch.long), torch.arange(2)
            with diffusion._precision():
                prefix = None
                if diffusion.split is not None:
                    with torch.no_grad():
                        prefix = diffusion._prefix(noisy, timesteps)
                kept, transient = measure_pair_memory(
                    lambda cond: diffusion._chunk(
                        prefix, noisy, timesteps, cond, latent_index, condition_index
                    ),
                    conditions,
                )
        return weights, kept, transient


@dataclass(frozen=True)
class _Tower:
    """The trained model of a stage: the vision tower, its projector and LoRA (hashable: cached)."""

    clip: str
    diffusion: str
    condition_mode: str
    patch_token_ratio: float
    lora: tuple
    trains: str  # TRAINED's values
    checkpointing: bool
    precision: str

    def vision_config(self, layers: int | None = None) -> Any:
        config = copy.deepcopy(_vision_config(self.clip))
        if layers is not None:
            config.num_hidden_layers = layers
        return config

    def image_size(self) -> int:
        return _vision_config(self.clip).image_size

    def build(self, layers: int | None = None) -> nn.Module:
        """The model the stage trains (`layers` encoder layers, default all), on the meta device."""
        pipeline = catalogue()[self.diffusion]["folders"]
        width = pipeline["unet"]["config.json"]["cross_attention_dim"]
        with torch.device("meta"):
            model = DCRModel(
                DCRConfig(
                    vision_config=self.vision_config(layers).to_dict(),
                    condition_dim=width,
                    num_condition_tokens=_context(self.diffusion),
                    condition_mode=self.condition_mode,
                    patch_token_ratio=self.patch_token_ratio,
                )
            )
            r, alpha, dropout, bias = self.lora
            trainable = prepare_stage(model, self.trains, LoraSettings(r, alpha, dropout, bias))
            if self.checkpointing:
                model.activation_checkpointing_enable({"use_reentrant": False})
        return trainable

    @functools.cache  # noqa: B019
    def weights(self) -> tuple[int, int]:
        """(bytes of the weights and buffers, bytes of the trained parameters)."""
        model = self.build()
        trained = [p for p in model.parameters() if p.requires_grad]
        return _bytes([*model.parameters(), *model.buffers()]), _bytes(trained)

    @functools.cache  # noqa: B019
    def activations(self, images: int) -> int:
        """What the forward over `images` views keeps for backward: measured with one encoder layer and with
        two on fake tensors, the second layer's share taken once per layer of the real tower."""
        one, two = (self._kept(layers, images) for layers in (1, 2))
        return one + (_vision_config(self.clip).num_hidden_layers - 1) * (two - one)

    def _kept(self, layers: int, images: int) -> int:
        model = self.build(layers)
        size = self.image_size()
        with FakeTensorMode():
            _fake(model)
            pixels = torch.rand(images, 3, size, size)
            with LiveMemory() as memory, _autocast(self.precision):
                outputs = model(pixel_values=pixels)  # held: its graph keeps what backward needs
                kept = memory.live
        del outputs
        return kept


@functools.cache
def _vision_config(repo: str) -> Any:
    """The vision configuration `DCRModel.from_clip` takes from `repo`'s real configuration (CLIP's with the
    model's projection width)."""
    from transformers import AutoConfig

    settings = dict(catalogue()[repo]["folders"]["."]["config.json"])
    settings.pop("architectures", None)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    vision = copy.deepcopy(getattr(config, "vision_config", config))
    if hasattr(config, "vision_config") and getattr(config, "projection_dim", None):
        vision.projection_dim = config.projection_dim
    return vision


def _context(repo: str) -> int:
    """The text encoder's context length: the condition's tokens."""
    return catalogue()[repo]["folders"]["text_encoder"]["config.json"]["max_position_embeddings"]


def _fake(module: nn.Module) -> None:
    """Every parameter and buffer of `module` replaced by a fake CPU tensor of its shape and dtype (built on
    the meta device first: modules move their tensors there freely, and fake ones cannot be swapped)."""
    for child in module.modules():
        for name, param in list(child._parameters.items()):
            if param is not None:
                fake = torch.empty(param.shape, dtype=param.dtype)
                child._parameters[name] = nn.Parameter(fake, requires_grad=param.requires_grad)
        for name, buffer in list(child._buffers.items()):
            if buffer is not None:
                child._buffers[name] = torch.zeros(buffer.shape, dtype=buffer.dtype)


@contextlib.contextmanager
def _autocast(precision: str) -> Iterator[None]:
    dtype = AUTOCAST.get(precision, torch.bfloat16 if precision == "auto" else None)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        yield
