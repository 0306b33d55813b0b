"""Test-wide settings: offline Hub, CPU, marker gating (slow / gpu / network)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models run fastest on one thread, and a thread of a multi-threaded op cannot stall on a core that a
# parallel test worker (pytest -n 2) or a spawned process holds.
torch.set_num_threads(1)


def _devices() -> list[str]:
    """Devices the device-parametrised tests run on: the CPU always, CUDA where available; the environment
    variable TORCH_DEVICE (as in timm's tests) picks one of them instead."""
    chosen = os.environ.get("TORCH_DEVICE")
    if chosen:
        return [chosen]
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=_devices())
def device(request):
    """The device a test runs its models on: tests of helpers take it to run on the CPU and on CUDA. On CUDA
    TF32 is off for the test (float32 references), whatever an earlier run's TrainingArguments(tf32=True) left
    in the process."""
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield torch.device(request.param)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@pytest.fixture(autouse=True)
def _pil_truncation_setting():
    """PIL's process-wide LOAD_TRUNCATED_IMAGES as each test found it: lmms-eval's task modules set it at
    import, and the tests of cut files must not depend on which tests a worker ran before."""
    from PIL import ImageFile

    setting = ImageFile.LOAD_TRUNCATED_IMAGES
    yield
    ImageFile.LOAD_TRUNCATED_IMAGES = setting


def pytest_collection_modifyitems(config, items):
    gates = {
        "slow": (os.environ.get("RUN_SLOW") == "1", "slow: set RUN_SLOW=1"),
        "gpu": (torch.cuda.is_available(), "gpu: needs CUDA"),
        "network": (os.environ.get("RUN_NETWORK") == "1", "network: set RUN_NETWORK=1"),
    }
    for item in items:
        for marker, (enabled, reason) in gates.items():
            if marker in item.keywords and not enabled:
                item.add_marker(pytest.mark.skip(reason=reason))
