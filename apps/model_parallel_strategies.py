"""Model-parallel strategies for the character transformer: tp, pp, 3d, moe.

Each strategy is ``fn(comm, args) -> dict`` of figures and is listed in ``STRATEGIES`` (with its
command-line options in ``add_arguments``) so ``apps/train_parallel.py --strategy ...`` runs
it; this file also runs alone:

    python -m needle.parallel.launch -n 2 apps/train_parallel.py --strategy tp
    python -m needle.parallel.launch -n 2 apps/model_parallel_strategies.py --strategy tp
    python -m needle.parallel.launch -n 4 apps/model_parallel_strategies.py --strategy pp \
        --schedule 1f1b --timeline pp_timeline.png
    python -m needle.parallel.launch -n 8 apps/model_parallel_strategies.py --strategy 3d \
        --dp 2 --pp 2 --tp 2
    python -m needle.parallel.launch -n 2 apps/model_parallel_strategies.py --strategy moe
"""
import argparse
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import numpy as np

import needle as ndl
from needle import nn
from needle.data.datasets.builtin import CharCorpus
from needle.parallel import Comm
from needle.parallel.mesh import ProcessMesh
from needle.parallel.moe import ExpertParallelMoE
from needle.parallel.pipeline import PipelineParallel, partition
from needle.parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelTransformerBlock,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

__all__ = ["STRATEGIES", "add_arguments", "run_tp", "run_pp", "run_3d", "run_moe"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the model-parallel strategies."""
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--chars", type=int, default=200_000)
    p.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--chunks", type=int, default=2, help="model chunks per stage (interleaved)")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--timeline", default="", help="PNG (and .json trace) of the pipeline step")


def batches(args: argparse.Namespace, vocab_multiple: int
            ) -> Tuple[Callable[[int], Tuple[np.ndarray, ...]], int]:
    """A deterministic batch sampler of (ids (B, T), next ids (B, T)) and the padded vocab."""
    corpus = CharCorpus(n_chars=args.chars)
    data = np.array(corpus.train, dtype=np.int64)
    vocab = len(corpus.dictionary)
    vocab += (-vocab) % vocab_multiple    # Megatron pads the vocabulary to a multiple of tp

    def get(step: int) -> Tuple[np.ndarray, np.ndarray]:
        rng = np.random.RandomState(step)
        starts = rng.randint(0, len(data) - args.seq_len - 1, size=args.batch)
        x = np.stack([data[s:s + args.seq_len] for s in starts])
        y = np.stack([data[s + 1:s + args.seq_len + 1] for s in starts])
        return x, y
    return get, vocab


class Embed(nn.Module):
    """Token (vocab-parallel) plus learned position embeddings: ids (B, T) -> (B, T, D)."""

    def __init__(self, vocab: int, d: int, seq_len: int, comm: Comm) -> None:
        super().__init__()
        self.tok = VocabParallelEmbedding(vocab, d, comm)
        self.pos = nn.Embedding(seq_len, d, gather=True)

    def forward(self, ids: ndl.Tensor) -> ndl.Tensor:
        b, t = ids.shape
        pos = self.pos(np.broadcast_to(np.arange(t), (b, t)))
        return self.tok(ids.numpy()) + pos


class Head(nn.Module):
    """Final LayerNorm and a column-parallel projection to this rank's vocabulary slice."""

    def __init__(self, d: int, vocab: int, comm: Comm) -> None:
        super().__init__()
        self.norm = nn.LayerNorm1d(d, fused=True)
        self.proj = ColumnParallelLinear(d, vocab, comm, bias=False)

    def forward(self, h: ndl.Tensor) -> ndl.Tensor:
        b, t, d = h.shape
        return self.proj(self.norm(h.reshape((b * t, d))))          # (B*T, V/tp)


def char_transformer(args: argparse.Namespace, vocab: int, tp_comm: Comm) -> List[nn.Module]:
    """Embed, the transformer blocks, Head: a list to run in order (or to cut into stages)."""
    d = args.d_model
    blocks = [ParallelTransformerBlock(d, args.heads, d // args.heads, 4 * d, tp_comm,
                                       sequence_parallel=False) for _ in range(args.layers)]
    return [Embed(vocab, d, args.seq_len, tp_comm), *blocks, Head(d, vocab, tp_comm)]


def _device(args: argparse.Namespace) -> Any:
    """The device ``apps/train_parallel.py --device`` picked for this rank (CPU alone)."""
    return getattr(args, "device", None) or ndl.cpu()


def _placed(modules: List[nn.Module], args: argparse.Namespace) -> List[nn.Module]:
    """``modules`` moved to this rank's device (built on the CPU: the same seed everywhere)."""
    dev = _device(args)
    return modules if dev == ndl.cpu() else [m.to(dev) for m in modules]


def _loss_fn(tp_comm: Comm) -> Callable[[ndl.Tensor, ndl.Tensor], ndl.Tensor]:
    def loss(logits: ndl.Tensor, y: ndl.Tensor) -> ndl.Tensor:
        return vocab_parallel_cross_entropy(logits, y.numpy().reshape(-1), tp_comm)
    return loss


def _train(comm: Comm, args: argparse.Namespace, step_fn: Callable[[int], float], params: List[Any],
           dp_comm: Optional[Comm] = None) -> Dict[str, Any]:
    opt = ndl.optim.Adam(params, lr=args.lr)
    losses, start = [], time.perf_counter()
    for step in range(args.steps):
        opt.reset_grad()
        loss = step_fn(step)
        if dp_comm is not None and dp_comm.size > 1:   # naive data parallelism: average grads
            for q in params:
                if q.grad is not None:
                    q.grad = ndl.Tensor(dp_comm.allreduce(q.grad.numpy(), op="avg"),
                                        device=q.device, dtype=q.dtype, requires_grad=False)
            loss = float(dp_comm.allreduce(np.array([loss]), op="avg")[0])
        opt.step()
        losses.append(loss)
        if comm.rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss:.4f}", flush=True)
    secs = time.perf_counter() - start
    tokens = args.steps * args.batch * args.seq_len
    return {"losses": losses, "first_loss": losses[0], "last_loss": losses[-1],
            "seconds": secs, "tokens_per_s": tokens / secs}


def run_tp(comm: Comm, args: argparse.Namespace) -> Dict[str, Any]:
    """Megatron tensor parallelism over all ranks."""
    get, vocab = batches(args, comm.size)
    np.random.seed(0)
    layers = _placed(char_transformer(args, vocab, comm), args)
    model = nn.Sequential(*layers)
    loss_fn = _loss_fn(comm)
    dev = _device(args)

    def step(i: int) -> float:
        x, y = get(i)
        loss = loss_fn(model(ndl.Tensor(x, device=dev, dtype="int64")),
                       ndl.Tensor(y, device=dev, dtype="int64"))
        loss.backward(create_graph=False)
        return float(loss.numpy())
    return _train(comm, args, step, model.parameters())


def _pipeline(comm: Comm, args: argparse.Namespace, mesh: ProcessMesh
              ) -> Tuple[PipelineParallel, Callable]:
    get, vocab = batches(args, mesh.tp.size)
    np.random.seed(0)
    layers = nn.Sequential(*_placed(char_transformer(args, vocab, mesh.tp), args))
    pp = mesh.pp.size
    v = args.chunks if args.schedule == "interleaved" else 1
    pieces = partition(layers, pp * v)
    chunks = [pieces[c * pp + mesh.pp_rank] for c in range(v)]
    pipe = PipelineParallel(chunks if v > 1 else chunks[0], mesh.pp, args.microbatches,
                            schedule=args.schedule, loss_fn=_loss_fn(mesh.tp),
                            device=_device(args))
    dp, r = mesh.dp.size, mesh.dp_rank

    def step(i: int) -> float:
        x, y = get(i)
        rows = slice(r * args.batch // dp, (r + 1) * args.batch // dp)
        return pipe.train_step(x[rows], y[rows])
    return pipe, step


def _write_timeline(pipe: PipelineParallel, path: str) -> None:
    from needle.parallel.pipeline import simulate
    from needle.parallel.pipeline.timeline import plot_gantt, write_chrome_trace
    measured = pipe.gather_timeline()
    if pipe.comm.rank == 0 and path:
        predicted = simulate(pipe.schedule, num_virtual=pipe.num_virtual).events
        plot_gantt(path, predicted, measured, title=f"{pipe.schedule_name}, p={pipe.num_stages}, "
                                                    f"m={pipe.num_microbatches}")
        write_chrome_trace(path.rsplit(".", 1)[0] + ".json", predicted, measured)
        print(f"timeline written to {path}", flush=True)


def run_pp(comm: Comm, args: argparse.Namespace) -> Dict[str, Any]:
    """Pipeline parallelism over all ranks (GPipe, 1F1B or interleaved)."""
    mesh = ProcessMesh(comm, dp=1, pp=comm.size, tp=1)
    pipe, step = _pipeline(comm, args, mesh)
    out = _train(comm, args, step, pipe.parameters())
    _write_timeline(pipe, args.timeline)
    return out


def run_3d(comm: Comm, args: argparse.Namespace) -> Dict[str, Any]:
    """Data x pipeline x tensor parallelism on one (dp, pp, tp) mesh."""
    mesh = ProcessMesh(comm, dp=args.dp, pp=args.pp, tp=args.tp)
    pipe, step = _pipeline(comm, args, mesh)
    out = _train(comm, args, step, pipe.parameters(), dp_comm=mesh.dp)
    _write_timeline(pipe, args.timeline)
    return out


class MoEModel(nn.Module):
    """Embedding, one attention layer, an expert-parallel MoE FFN, and the output projection."""

    def __init__(self, vocab: int, args: argparse.Namespace, comm: Comm) -> None:
        super().__init__()
        d = args.d_model
        self.emb = nn.Embedding(vocab, d, gather=True)
        self.attn = nn.AttentionLayer(d, args.heads, d // args.heads, causal=True)
        self.norm = nn.LayerNorm1d(d, fused=True)
        self.moe = ExpertParallelMoE(d, 4 * d, args.experts, comm, top_k=args.top_k)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: np.ndarray) -> ndl.Tensor:
        b, t = ids.shape
        h = self.emb(ids)                                            # (B, T, D)
        h = h + self.attn(h)
        h = h + self.moe(self.norm(h.reshape((b * t, h.shape[2]))).reshape(h.shape))
        return self.head(h.reshape((b * t, h.shape[2])))


def run_moe(comm: Comm, args: argparse.Namespace) -> Dict[str, Any]:
    """Expert parallelism: each rank its own tokens, experts sharded, replicated rest averaged."""
    get, vocab = batches(args, 1)
    np.random.seed(0)
    model = cast(MoEModel, _placed([MoEModel(vocab, args, comm)], args)[0])
    dev = _device(args)
    experts = {id(q) for e in model.moe.experts for q in e.parameters()}
    p, r = comm.size, comm.rank

    def step(i: int) -> float:
        x, y = get(i)
        rows = slice(r * args.batch // p, (r + 1) * args.batch // p)
        logits = model(x[rows])
        loss = nn.SoftmaxLoss()(logits, ndl.Tensor(y[rows].reshape(-1), device=dev,
                                                   dtype="int64"))
        aux = model.moe.aux_loss
        assert aux is not None, "the MoE layer sets its auxiliary loss in forward"
        (loss + aux * 0.01).backward(create_graph=False)
        for q in model.parameters():     # global loss = mean over ranks of the local losses
            if q.grad is None:
                continue
            g = q.grad.numpy() / p if id(q) in experts else comm.allreduce(q.grad.numpy(),
                                                                         op="avg")
            q.grad = ndl.Tensor(g, device=q.device, dtype=q.dtype, requires_grad=False)
        return float(comm.allreduce(np.array([float(loss.numpy())]), op="avg")[0])
    out = _train(comm, args, step, model.parameters())
    out["dropped_last_step"] = model.moe.dropped
    return out


STRATEGIES: Dict[str, Callable[[Comm, argparse.Namespace], Dict[str, Any]]] = {
    "tp": run_tp, "pp": run_pp, "3d": run_3d, "moe": run_moe}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run one strategy under mpiexec (or the launcher) with ``apps.train_parallel``'s checks
    (a learning rate of inf, a batch of 0, a heads count that does not divide are refused)."""
    if __package__:
        from . import train_parallel
    else:  # run as a script: apps/ is on sys.path
        import train_parallel  # type: ignore[no-redef]
    return train_parallel.main(argv, sorted(STRATEGIES), "python -m apps.model_parallel_strategies")


if __name__ == "__main__":
    main()
