"""`hf-vrl` in a fresh process for the resume, kill and multi-process tests: `python _run_worker.py <argv>`.

One torch thread in every process, as in the test process (conftest), so runs compared across processes
reduce in the same order. `HF_VRL_TEST_KILL` makes the process SIGKILL itself at a chosen point (real fault
injection, the kill a user's `kill -9` or a pre-empted node does):
    "step:<stage>:<n>"  at the start of training step n+1 of stage <stage> (after step n and its checkpoint)
    "save:<stage>:<n>"  in the middle of writing the checkpoint of step n (weights written, RNG state not)
    "term:<stage>:<n>" / "int:<stage>:<n>"  SIGTERM / SIGINT instead, once (pre-emption, Ctrl-C)
    "sleep:<stage>:<n>"  sleep there, holding the run, until the test kills the process
`HF_VRL_TEST_FSDP_ON_CPU=1` lets accelerate shard with FSDP on a CPU process group (`_allow_fsdp_on_cpu`).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

torch.set_num_threads(1)


def _install_kill(spec: str) -> None:
    from hf_vrl.trainer import VRLTrainer

    point, stage, step = spec.split(":")
    step = int(step)

    def ours(trainer: VRLTrainer) -> bool:
        return os.path.basename(trainer.args.output_dir) == stage and trainer.state.global_step == step

    if point in ("step", "term", "int", "sleep"):
        original = VRLTrainer.training_step
        sent = signal.SIGTERM if point == "term" else signal.SIGINT if point == "int" else signal.SIGKILL

        def training_step(self, *args, **kwargs):
            if ours(self) and not getattr(self, "_test_signalled", False):
                self._test_signalled = True
                if point == "sleep":
                    time.sleep(600)  # hold the run (and its folder lock) until the test kills it
                else:
                    os.kill(os.getpid(), sent)
            return original(self, *args, **kwargs)

        VRLTrainer.training_step = training_step
    else:
        original_save = VRLTrainer._save_rng_state

        def _save_rng_state(self, output_dir):
            if ours(self):
                os.kill(os.getpid(), signal.SIGKILL)
            return original_save(self, output_dir)

        VRLTrainer._save_rng_state = _save_rng_state


def _allow_fsdp_on_cpu() -> None:
    """Let accelerate run FSDP on a CPU process group, as it does on GPUs.

    accelerate 1.15 turns `ACCELERATE_USE_FSDP` into `DistributedType.FSDP` only inside the branch of
    `AcceleratorState.__init__` for GPU-like process groups (MULTI_GPU, MULTI_NPU, ...); a CPU group is
    MULTI_CPU there, so the FSDP plugin is dropped without a word and the run trains as plain data parallel.
    torch's FSDP2 itself shards, gathers and checkpoints on CPU with gloo: this lifts accelerate's gate only,
    so the CPU tests run the code path CUDA users run.
    """
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin

    AcceleratorState.__init__ = __init__


if __name__ == "__main__":
    if os.environ.get("HF_VRL_TEST_FSDP_ON_CPU") == "1":
        _allow_fsdp_on_cpu()
    if os.environ.get("HF_VRL_TEST_KILL"):
        _install_kill(os.environ["HF_VRL_TEST_KILL"])
    from hf_vrl.cli import main

    sys.exit(main(sys.argv[1:]))
