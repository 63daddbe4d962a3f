"""apps/ on ndl.cuda(): the demo's models and apps.train_parallel --device cuda train with the
same losses as on ndl.cpu() (on a GPU, or on the CUDA emulator where there is none)."""
import json
import subprocess
import sys

import numpy as np
import pytest
from mpi_helpers import ROOT, mpiexec, worker_env

import needle as ndl
from apps.mlp_resnet import MLPResNet, epoch
from apps.models import LanguageModel
from needle import nn

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ndl.cuda().enabled(), reason="no GPU (NEEDLE_CUDA_EMULATOR=1 "
                                 "runs the emulator instead)")]
DEVICES = [ndl.cpu(), ndl.cuda()]


class _First(ndl.data.Dataset):
    """The first ``n`` samples of a dataset."""

    def __init__(self, data: ndl.data.Dataset, n: int):
        super().__init__()
        self.data, self.n = data, n

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self) -> int:
        return self.n


def _digits_losses(device) -> list:
    """Two epochs of the demo's MLPResNet (BatchNorm, Adam) on 96 digits, batches of 32."""
    np.random.seed(0)
    train, _ = ndl.data.digits_datasets(test_fraction=0.2, seed=0)
    data = _First(train, 96)
    loader = ndl.data.DataLoader(data, batch_size=32, device=device)
    # drop_prob=0: the CPU and CUDA dropout masks come from different generators by design
    model = MLPResNet(64, hidden_dim=32, num_blocks=2, num_classes=10, drop_prob=0.0).to(device)
    opt = ndl.optim.Adam(model.parameters(), lr=0.002, weight_decay=1e-4)
    return [epoch(loader, model, opt, progress=False, seed=None)[1] for _ in range(2)]


def _charlm_losses(device) -> list:
    """Four Adam steps of the demo's character Transformer (smaller) on one batch of windows."""
    np.random.seed(0)
    model = LanguageModel(16, 20, 32, num_layers=1, seq_model="transformer", seq_len=8,
                          num_head=2, dim_head=8, device=device)
    opt = ndl.optim.Adam(model.parameters(), lr=3e-3)
    ids = np.random.default_rng(0).integers(0, 20, size=(9, 4))  # (T + 1, B)
    losses = []
    for _ in range(4):
        x = ndl.Tensor(ids[:-1], device=device, dtype="float32", requires_grad=False)
        y = ndl.Tensor(ids[1:].reshape(-1), device=device, dtype="int64", requires_grad=False)
        loss = nn.SoftmaxLoss()(model(x)[0], y)
        opt.reset_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return losses


@pytest.mark.parametrize("train", [_digits_losses, _charlm_losses], ids=["mlp_resnet", "charlm"])
def test_demo_models_train_the_same_on_cuda_and_cpu(train):
    cpu, cuda = (train(d) for d in DEVICES)
    assert cpu[-1] < cpu[0]  # it learns
    np.testing.assert_allclose(cuda, cpu, rtol=2e-4)


def _train_parallel(tmp_path, device: str) -> dict:
    mpiexec()  # skips when there is none
    out = tmp_path / f"{device}.json"
    cmd = [sys.executable, "-m", "needle.parallel.launch", "-n", "2", "-m", "apps.train_parallel",
           "--strategy", "ddp", "--device", device, "--steps", "3", "--batch", "8",
           "--dtype", "float64", "--check", "--no-progress", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT,
                         env=worker_env(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"),
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"({ndl.cuda()!r})" in res.stdout or device == "cpu"
    return json.loads(out.read_text())


@pytest.mark.mpi
@pytest.mark.slow
def test_train_parallel_ddp_on_cuda_matches_cpu(tmp_path):
    """Two ranks on cuda: gradients allreduced through host staging, the same as one process,
    and the same losses as on the CPU (float64: hyperparameters rounded to float32 in the Adam
    kernel made them differ by 1e-6)."""
    cuda = _train_parallel(tmp_path, "cuda")
    assert cuda["max_param_diff_vs_single_process"] < 1e-9
    cpu = _train_parallel(tmp_path, "cpu")
    np.testing.assert_allclose(cuda["losses"], cpu["losses"], rtol=1e-10)
