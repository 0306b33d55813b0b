"""SIGTERM and SIGINT (pre-emption, Ctrl-C) stop a run without losing its work.

While a stage trains (`saving_on_signal`), the first signal is only recorded: at the end of the current
optimiser step the trainer saves a complete checkpoint and stops (`hf_vrl.trainer.SaveAndStopOnSignal`, the
processes agree on the step), then `RunInterrupted` ends the run; `--resume auto` continues from that
checkpoint exactly. Outside training (setup, evaluation, writing results: all atomic) or on a second signal,
`RunInterrupted` is raised at once. The CLI prints one line and exits with 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from hf_vrl.errors import UserError

logger = logging.getLogger("hf_vrl.run")

__all__ = ["RunInterrupted", "handle_signals", "saving_on_signal", "stop_requested"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state: dict[str, object] = {"signal": None, "armed": None, "saved": False}


class RunInterrupted(UserError):
    """The run was stopped by a signal; `exit_code` is 128 + its number."""

    def __init__(self, signum: int, saved: bool):
        name = signal.Signals(signum).name
        what = (
            "saved a checkpoint at the current step" if saved else "nothing lost: every result is saved whole"
        )
        super().__init__(f"{name} ({what}); continue with the same command and --resume auto")
        self.exit_code = 128 + signum


def _handler(signum: int, frame: object) -> None:
    first = _state["signal"] is None
    _state["signal"] = signum
    if _state["armed"] is None or not first:
        raise RunInterrupted(signum, saved=False)
    logger.warning(
        "%s: saving a checkpoint at the end of this step, then stopping (send it again to stop at once)",
        signal.Signals(signum).name,
    )


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """Install the handlers for the duration of a run (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS}
    _state.update(signal=None, armed=None)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state.update(signal=None, armed=None)


@contextlib.contextmanager
def saving_on_signal(checkpoints: Path) -> Iterator[None]:
    """Around the training of the stage whose checkpoints go to `checkpoints`: a signal saves and stops."""
    _state["armed"] = str(Path(checkpoints).resolve())
    try:
        yield
    finally:
        _state["armed"] = None
    if _state["signal"] is not None:
        raise RunInterrupted(int(_state["signal"]), saved=True)  # type: ignore[arg-type]


def stop_requested(output_dir: str) -> bool:
    """Whether the trainer writing to `output_dir` must save and stop now; every process of a process group
    gets the same answer (called by all of them at each step end of the armed stage)."""
    armed = _state["armed"]
    if armed is None or str(Path(output_dir).resolve()) != armed:
        return False
    local = _state["signal"] is not None
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if local else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
