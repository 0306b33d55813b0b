"""A run under measurement: `python -m hf_vrl.run.probe --record FILE [--kill-at STAGE:STEP] -- METHOD ARGS`.

Runs `hf-vrl train METHOD ARGS` through the run package's own entry (`hf_vrl.run.main`, not the CLI's) with
a `StepProbe` on every trainer the run builds. Per optimiser step it appends one JSON line to FILE
(`FILE.rank<r>` under several processes), written before the next step starts, so a killed run keeps what it
measured:
  stage, step, rank, device      which step (`step` counts from 1, as the checkpoint names)
  step_s                         forward, backward and optimiser step (on CUDA after a synchronisation)
  cpu_s                          this process's CPU time in them (all threads): on a shared CPU the figure
                                 other processes disturb least
  wait_s                         from the previous step's end (its checkpoint included) to this step's start
  static_bytes                   tensors alive at the step's start but the step's data: weights, buffers,
                                 optimiser state, frozen models (CUDA: allocated; CPU: every CPU tensor)
  data_bytes                     the largest batch one training_step call received (what goes to the device)
  data_samples                   the samples in that batch (a micro-batch)
  grad_bytes                     the gradients of the trainable parameters
  step_peak_bytes                the most the forward/backward passes held above static_bytes, data included
  optimizer_peak_bytes           the most the optimiser step held above static_bytes + grad_bytes
  host_peak_bytes                the process's peak resident memory during the step (Linux)
  device_peak_bytes              CUDA only: the allocator's peak during the step
On the CPU the tensor figures come from `hf_vrl.methods.dcr.memory.LiveMemory` (the bytes of the tensors the
step's operations create), which is what a CUDA allocator would be asked for; `hf_vrl.run.dry_run` turns
them into the memory predicted on a GPU.
`--kill-at STAGE:STEP` SIGKILLs the process at the start of step STEP+1 of STAGE, after step STEP and its
checkpoint: the kill a pre-empted node or `kill -9` does.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from hf_vrl.run import main as train_main

__all__ = ["StepProbe", "install", "main", "tensor_bytes"]


def tensor_bytes(tree: Any) -> int:
    """Bytes of the tensors in a (nested) batch."""
    from torch.utils._pytree import tree_flatten

    leaves = tree_flatten(tree)[0]
    return sum(leaf.numel() * leaf.element_size() for leaf in leaves if isinstance(leaf, torch.Tensor))


def batch_samples(tree: Any) -> int:
    """Samples in a (nested) batch: the first dimension of its tensors."""
    from torch.utils._pytree import tree_flatten

    leaves = tree_flatten(tree)[0]
    return max((leaf.shape[0] for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.ndim), default=0)


def _cpu_tensor_bytes() -> int:
    """Bytes of every CPU tensor alive in this process (storages counted once)."""
    storages: dict[int, int] = {}
    for obj in gc.get_objects():  # type(): isinstance would touch deprecated module attributes (warnings)
        if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu" and not obj.is_sparse:
            try:
                storage = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage of its own
                continue
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _host_peak() -> int | None:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


def _reset_host_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


class StepProbe(TrainerCallback):
    """Times and measures every optimiser step of the trainer it is added to (see the module docstring)."""

    def __init__(self, record: Path, kill_at: tuple[str, int] | None = None) -> None:
        self.record = record
        self.kill_at = kill_at
        self.stage = ""
        self.last_end = time.perf_counter()
        self.data_bytes = self.data_samples = 0
        self.step_data_bytes = 0
        self._live: Any = None
        self._figures: dict[str, Any] = {}

    def _cuda(self, args: Any) -> bool:
        return args.device.type == "cuda"

    def _now(self, args: Any) -> float:
        if self._cuda(args):
            torch.cuda.synchronize()
        return time.perf_counter()

    def _start_live(self) -> None:
        from hf_vrl.methods.dcr.memory import LiveMemory

        self._live = LiveMemory()
        self._live.__enter__()

    def _stop_live(self) -> int:
        live, self._live = self._live, None
        live.__exit__(None, None, None)
        return live.peak

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stage = os.path.basename(os.path.normpath(args.output_dir))
        self.last_end = self._now(args)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.kill_at == (self.stage, state.global_step):
            os.kill(os.getpid(), signal.SIGKILL)
        cuda = self._cuda(args)
        trainable = [p for p in model.parameters() if p.requires_grad] if model is not None else []
        static = torch.cuda.memory_allocated() if cuda else _cpu_tensor_bytes() - self.step_data_bytes
        self._figures = {
            "wait_s": self._now(args) - self.last_end,
            "static_bytes": static,
            "grad_bytes": sum(p.numel() * p.element_size() for p in trainable),
        }
        self.data_bytes = self.data_samples = self.step_data_bytes = 0
        _reset_host_peak()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            self._start_live()
        self._figures["start"] = time.perf_counter()
        self._figures["cpu_start"] = time.process_time()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._cuda(args):
            self._figures["step_peak_bytes"] = (
                torch.cuda.max_memory_allocated() - self._figures["static_bytes"]
            )
            self._figures["before_optimizer"] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._figures["step_peak_bytes"] = self._stop_live() + self.data_bytes
            self._start_live()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._cuda(args):
            optimizer = torch.cuda.max_memory_allocated() - self._figures.pop("before_optimizer")
            self._figures["device_peak_bytes"] = max(
                self._figures["static_bytes"] + self._figures["step_peak_bytes"],
                torch.cuda.max_memory_allocated(),
            )
        else:
            optimizer = self._stop_live()
        self._figures["optimizer_peak_bytes"] = optimizer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        end = self._now(args)
        figures = self._figures
        line = {
            "stage": self.stage,
            "step": state.global_step,
            "rank": args.process_index,
            "device": args.device.type,
            "step_s": end - figures.pop("start"),
            "cpu_s": time.process_time() - figures.pop("cpu_start"),
            **figures,
            "data_bytes": self.data_bytes,
            "data_samples": self.data_samples,
            "host_peak_bytes": _host_peak(),
        }
        with open(self.record, "a") as out:
            out.write(json.dumps(line) + "\n")
        self.last_end = self._now(args)

    def count_batch(self, inputs: Any) -> None:
        size = tensor_bytes(inputs)
        if size > self.data_bytes:
            self.data_bytes, self.data_samples = size, batch_samples(inputs)
        self.step_data_bytes += size


def install(record: Path, kill_at: tuple[str, int] | None = None) -> None:
    """Give every `VRLTrainer` built in this process a `StepProbe` writing to `record`."""
    from hf_vrl.trainer import VRLTrainer

    init, training_step = VRLTrainer.__init__, VRLTrainer.training_step

    def probed_init(self: VRLTrainer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._probe = StepProbe(record, kill_at)
        self.add_callback(self._probe)

    def probed_training_step(self: VRLTrainer, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self._probe.count_batch(inputs)
        return training_step(self, model, inputs, *args, **kwargs)

    VRLTrainer.__init__ = probed_init
    VRLTrainer.training_step = probed_training_step


def read_records(record: Path) -> list[dict[str, Any]]:
    """The step lines of `record` and of its per-rank files, in the order they were written."""
    name = re.compile(rf"{re.escape(record.name)}(\.rank\d+)?")
    files = sorted(path for path in record.parent.glob(f"{record.name}*") if name.fullmatch(path.name))
    return [json.loads(line) for path in files for line in path.read_text().splitlines()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_vrl.run.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, required=True, help="the JSON-lines file of the step figures")
    parser.add_argument(
        "--kill-at", metavar="STAGE:STEP", help="SIGKILL at the start of step STEP+1 of STAGE"
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- and the method and arguments of hf-vrl train"
    )
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    rank = int(os.environ.get("RANK", "0"))
    record = args.record if int(os.environ.get("WORLD_SIZE", "1")) == 1 else Path(f"{args.record}.rank{rank}")
    record.parent.mkdir(parents=True, exist_ok=True)
    kill_at = None
    if args.kill_at:
        stage, _, step = args.kill_at.rpartition(":")
        kill_at = (stage, int(step))
    if not command:
        parser.error("give -- and the method to train, then its arguments")
    install(record, kill_at)
    return train_main(command[0], command[1:])


if __name__ == "__main__":
    sys.exit(main())
