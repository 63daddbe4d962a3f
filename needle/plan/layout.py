"""One way to lay a training step out on the GPUs: the degrees and the memory-saving choices."""
from dataclasses import dataclass

__all__ = ["Layout", "Setup", "RECOMPUTE", "PRECISIONS", "OPTIMIZERS"]

RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("fp32", "mixed")
OPTIMIZERS = ("sgd", "adam", "adamw", "adafactor")


@dataclass(frozen=True)
class Setup:
    """The training set-up: global batch (sequences), precision, optimizer."""

    batch: int
    precision: str = "mixed"
    optimizer: str = "adamw"

    def check(self) -> "Setup":
        """Raise ValueError naming the field and the rule."""
        if not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"batch must be a positive integer, got {self.batch!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        return self


@dataclass(frozen=True)
class Layout:
    """dp x tp x pp GPUs; ZeRO stage; sequence parallel; schedule; recompute; microbatch."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0                # 0 = DDP, 1/2 = ZeRO-1/2, 3 = ZeRO-3 / FSDP
    sp: bool = False             # sequence parallel (with tp > 1)
    schedule: str = "1f1b"       # with pp > 1: a name of parallel.pipeline's SCHEDULES
    chunks: int = 1              # model chunks per stage (interleaved)
    recompute: str = "none"
    microbatch: int = 1          # sequences per microbatch
    offload: bool = False        # optimizer state and step on the CPU (ZeRO-Offload)

    @property
    def gpus(self) -> int:
        """GPUs the layout uses."""
        return self.dp * self.tp * self.pp

    @property
    def strategy(self) -> str:
        """single / ddp / zero1-3 / tp / pp / tp+dp / pp+dp / tp+pp / 3d."""
        model = [n for n, d in (("tp", self.tp), ("pp", self.pp)) if d > 1]
        if len(model) == 2 or (model and self.dp > 1):
            return "3d" if len(model) == 2 and self.dp > 1 else "+".join(
                model + (["dp"] if self.dp > 1 else []))
        if model:
            return model[0]
        if self.gpus == 1:
            return "single"
        return "ddp" if self.zero == 0 else f"zero{self.zero}"

    def describe(self) -> str:
        """A short human-readable name."""
        bits = [self.strategy, f"dp={self.dp} tp={self.tp} pp={self.pp}"]
        if self.zero and self.dp > 1 and self.strategy not in ("zero1", "zero2", "zero3"):
            bits.append(f"zero{self.zero}")
        if self.sp:
            bits.append("sp")
        if self.pp > 1:
            bits.append(self.schedule + (f"(v={self.chunks})" if self.chunks > 1 else ""))
        if self.recompute != "none":
            bits.append(f"ckpt={self.recompute}")
        bits.append(f"mb={self.microbatch}")
        if self.offload:
            bits.append("offload")
        return " ".join(bits)
