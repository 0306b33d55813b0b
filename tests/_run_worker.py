"""`hf-vrl` in a fresh process for the resume, kill and multi-process tests: `python _run_worker.py <argv>`.

One torch thread in every process, as in the test process (conftest), so runs compared across processes
reduce in the same order. `HF_VRL_TEST_KILL` makes the process SIGKILL itself at a chosen point (real fault
injection, the kill a user's `kill -9` or a pre-empted node does):
    "step:<stage>:<n>"  at the start of training step n+1 of stage <stage> (after step n and its checkpoint)
    "save:<stage>:<n>"  in the middle of writing the checkpoint of step n (weights written, RNG state not)
"""

from __future__ import annotations

import os
import signal
import sys

import torch

torch.set_num_threads(1)


def _install_kill(spec: str) -> None:
    from hf_vrl.trainer import VRLTrainer

    point, stage, step = spec.split(":")
    step = int(step)

    def ours(trainer: VRLTrainer) -> bool:
        return os.path.basename(trainer.args.output_dir) == stage and trainer.state.global_step == step

    if point == "step":
        original = VRLTrainer.training_step

        def training_step(self, *args, **kwargs):
            if ours(self):
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)

        VRLTrainer.training_step = training_step
    else:
        original_save = VRLTrainer._save_rng_state

        def _save_rng_state(self, output_dir):
            if ours(self):
                os.kill(os.getpid(), signal.SIGKILL)
            return original_save(self, output_dir)

        VRLTrainer._save_rng_state = _save_rng_state


if __name__ == "__main__":
    if os.environ.get("HF_VRL_TEST_KILL"):
        _install_kill(os.environ["HF_VRL_TEST_KILL"])
    from hf_vrl.cli import main

    sys.exit(main(sys.argv[1:]))
