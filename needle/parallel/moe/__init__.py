"""Expert parallelism for ``nn.MoE``: experts sharded over ranks, tokens moved by all-to-all."""
from .ep_comms import all_to_all
from .expert_parallel import ExpertParallelMoE

__all__ = ["ExpertParallelMoE", "all_to_all"]
