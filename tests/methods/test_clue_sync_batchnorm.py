"""clue.sync_batchnorm: ReSA's SyncBatchNorm on several processes. The conversion and its way back (saved
models and exports keep stock BatchNorm) run everywhere; the statistics of two processes against one process
over the union batch need CUDA, because torch's SyncBatchNorm refuses CPU tensors (and has no CPU kernels).

Light imports at the top: the spawned processes import this module."""

from __future__ import annotations

import copy

import pytest
import torch
from clue_helpers import tiny_model
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hf_vrl.methods.clue.model import to_plain_batchnorm, to_sync_batchnorm

WORLD, PER_PROCESS = 2, 4
STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def _batchnorms(model: nn.Module) -> dict[str, nn.Module]:
    return {name: module for name, module in model.named_modules() if isinstance(module, _BatchNorm)}


def _views(device, dtype=torch.float64) -> torch.Tensor:
    """The union batch: WORLD x PER_PROCESS images in two 16-pixel views."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(WORLD * PER_PROCESS, 2, 3, 16, 16, generator=gen, dtype=dtype).to(device)


def _train_forward(model: nn.Module, views: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a training step does to the BatchNorm statistics (both branches, both views); returns them."""
    model.train()
    model(pixel_values=views)
    with torch.no_grad():
        model(pixel_values=views, momentum=True)
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if k.endswith(STATISTICS)}


def test_round_trip_keeps_weights_statistics_and_classes(tmp_path):
    model = tiny_model(num_parts=3, text_embed_dim=5)
    before = copy.deepcopy(model)
    classes = {name: type(m) for name, m in _batchnorms(model).items()}
    assert {nn.BatchNorm1d, nn.BatchNorm2d} <= set(classes.values())  # heads and ResNet
    parameters, modules = dict(model.named_parameters()), dict(model.named_modules())
    synced = to_sync_batchnorm(model)
    assert synced is model and set(_batchnorms(synced)) == set(classes)
    assert all(type(m) is nn.SyncBatchNorm for m in _batchnorms(synced).values())
    assert all(m is modules[name] for name, m in synced.named_modules())  # in place: DDP's, hooks
    assert all(p is parameters[name] for name, p in synced.named_parameters())  # the optimiser's
    assert not any(p.requires_grad for _, m in synced.momentum_pairs() for p in m.parameters())
    # one process: SyncBatchNorm falls back to batch_norm, so training matches the plain model bit for bit
    views = _views("cpu", torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(_train_forward(synced, views).values(),
                                                 _train_forward(before, views).values()))  # fmt: skip
    plain = to_plain_batchnorm(synced)
    assert {name: type(m) for name, m in _batchnorms(plain).items()} == classes
    assert all(p is parameters[name] for name, p in plain.named_parameters())
    assert plain.training and not any(
        p.requires_grad for _, m in plain.momentum_pairs() for p in m.parameters()
    )
    state, expected = plain.state_dict(), before.state_dict()
    assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)
    plain.save_pretrained(tmp_path)
    loaded = type(plain).from_pretrained(tmp_path)
    assert {name: type(m) for name, m in _batchnorms(loaded).items()} == classes
    assert to_plain_batchnorm(loaded) is loaded  # nothing to undo on a plain model


def test_a_single_layer_converts_in_place_and_a_foreign_syncbatchnorm_is_refused():
    layer = nn.BatchNorm1d(4, affine=False)
    buffers = dict(layer.named_buffers())
    assert to_sync_batchnorm(layer) is layer and type(layer) is nn.SyncBatchNorm and layer.weight is None
    assert to_plain_batchnorm(layer) is layer and type(layer) is nn.BatchNorm1d
    assert dict(layer.named_buffers()) == buffers and not hasattr(layer, "process_group")
    with pytest.raises(TypeError, match="to_sync_batchnorm"):
        to_plain_batchnorm(nn.SyncBatchNorm(4))


def sync_worker(rank: int, out_dir: str, device: str, sync: bool) -> None:
    """One of two processes: its share of the union batch through the tiny CLUE model (float64), with
    SyncBatchNorm or without; writes its BatchNorm statistics."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=WORLD)
    model = tiny_model(num_parts=3).to(device, torch.float64)
    if sync:
        model = to_sync_batchnorm(model)
    statistics = _train_forward(model, _views(device)[rank * PER_PROCESS : (rank + 1) * PER_PROCESS])
    save_file({k: v.contiguous() for k, v in statistics.items()}, f"{out_dir}/rank{rank}.safetensors")
    dist.barrier()
    dist.destroy_process_group()


def test_two_processes_keep_the_statistics_of_the_union_batch(tmp_path, device):
    if device.type == "cpu":
        pytest.skip("torch's SyncBatchNorm runs on GPUs only: it refuses CPU tensors")
    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    union = _train_forward(tiny_model(num_parts=3).to(device, torch.float64), _views(device))
    for sync in (True, False):
        folder = tmp_path / f"sync-{sync}"
        folder.mkdir()
        mp.spawn(sync_worker, args=(str(folder), str(device), sync), nprocs=WORLD, join=True)
        for rank in range(WORLD):
            statistics = load_file(str(folder / f"rank{rank}.safetensors"))
            assert statistics.keys() == union.keys()
            if sync:
                for key, value in statistics.items():
                    torch.testing.assert_close(value, union[key], rtol=1e-10, atol=1e-12, msg=key)
            else:  # each process's own half
                means = [k for k in union if k.endswith("running_mean")]
                assert not all(torch.allclose(statistics[k], union[k], rtol=1e-6) for k in means)


def test_sync_batchnorm_needs_the_setting_several_processes_and_a_gpu(caplog):
    from types import SimpleNamespace

    from clue_helpers import tiny_settings

    from hf_vrl.methods.clue.method import CLUEMethod

    method = CLUEMethod.__new__(CLUEMethod)
    method.settings = tiny_settings()
    method.run = SimpleNamespace(world_size=2, device=torch.device("cuda"), is_main=True)
    assert method._sync_batchnorm()
    method.run.world_size = 1
    assert not method._sync_batchnorm()
    method.run.world_size, method.settings = 2, tiny_settings(sync_batchnorm=False)
    assert not method._sync_batchnorm()
    method.run.device, method.settings = torch.device("cpu"), tiny_settings()
    with caplog.at_level("WARNING", logger="hf_vrl.methods.clue.method"):
        assert not method._sync_batchnorm()
    assert "SyncBatchNorm needs GPUs" in caplog.text


def test_a_run_trains_with_syncbatchnorm_and_saves_stock_batchnorm(tmp_path, monkeypatch):
    """The conversion forced on one CPU process (where SyncBatchNorm computes plain batch_norm): the Trainer
    gets SyncBatchNorm layers; the model saved, evaluated and exported has BatchNorm1d/2d again."""
    from transformers import AutoModel, ResNetModel

    import hf_vrl
    from hf_vrl.methods.clue.method import CLUEMethod
    from hf_vrl.methods.clue.trainer import CLUETrainer

    seen, init = [], CLUETrainer.__init__

    def spy(self, *args, **kwargs):
        seen.append({type(m) for m in _batchnorms(kwargs["model"]).values()})
        init(self, *args, **kwargs)

    saved, save_final = [], CLUEMethod.save_final

    def spy_save(self, model, folder):
        saved.append({type(m) for m in _batchnorms(model).values()})
        save_final(self, model, folder)

    monkeypatch.setattr(CLUETrainer, "__init__", spy)
    monkeypatch.setattr(CLUEMethod, "save_final", spy_save)
    monkeypatch.setattr(CLUEMethod, "_sync_batchnorm", lambda self: True)
    out = tmp_path / "run"
    hf_vrl.train(
        "clue", output_dir=str(out), train_limit=16, batch_size=4, max_steps=1, save_steps=1,
        backbone_pretrain_steps=0, eval_before=False, eval_after=False, part_map_images=0,
    )  # fmt: skip
    assert seen == [{nn.SyncBatchNorm}] and saved == [
        {nn.BatchNorm1d, nn.BatchNorm2d}
    ]  # what is evaluated too
    final = AutoModel.from_pretrained(out / "final", trust_remote_code=True)
    assert {type(m) for m in _batchnorms(final).values()} == {nn.BatchNorm1d, nn.BatchNorm2d}
    backbone = ResNetModel.from_pretrained(out / "exports" / "backbone")
    assert {type(m) for m in _batchnorms(backbone).values()} == {nn.BatchNorm2d}
