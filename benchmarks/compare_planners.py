"""needle.plan side by side with DeepSpeed's ZeRO estimators, ``accelerate estimate-memory``
and ``llm-analysis`` on the same configurations (each skipped with a note when not installed;
none is a dependency of needle).

    python benchmarks/compare_planners.py

Prints a Markdown table: per configuration and tool, per-GPU memory (GB = 1e9 bytes) and, where
the tool predicts it, step time. Where a published measurement exists it is in the last column.
"""
import importlib.util
import io
import logging
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from needle.plan import Layout, Setup, cluster, model, predict  # noqa: E402

Row = Tuple[str, str, str, str, str]  # config, tool, memory, time, note

CONFIGS: Dict[str, Dict[str, Any]] = {
    "ZeRO Fig. 1: 7.5B, 64 GPUs, ZeRO-3, mixed Adam": dict(
        params=7.5e9, zero=3, dp=64, batch=64, published="1.9 GB model states (paper)"),
    "GPT-1, 1 A100-80GB, batch 64 x 512, mixed AdamW": dict(
        spec="gpt1", batch=64, dp=1, zero=0, published="30.3 GB measured (course notes)"),
    "LLaMA-7B, 8 A100-80GB, ZeRO-3, batch 8 x 2048, selective": dict(
        spec="llama-7b", batch=8, dp=8, zero=3, recompute="selective", published=""),
    "GPT-3 175B, 1024 A100, t8 p16 d8, batch 1536, full recompute": dict(
        spec="gpt3-175b", batch=1536, dp=8, tp=8, pp=16, zero=1, recompute="full",
        published=""),
}


def _gb(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / 1e9:.2f}"


def needle_plan(c: Dict[str, Any]) -> Row:
    """needle.plan's per-GPU total and step time for the configuration's layout."""
    gpus = c.get("dp", 1) * c.get("tp", 1) * c.get("pp", 1)
    cl = cluster.preset("dgx-a100-80g", nodes=max(1, gpus // 8), gpus_per_node=min(8, gpus))
    spec = model.ModelSpec(params=c["params"]) if "params" in c else model.preset(c["spec"])
    lay = Layout(dp=c.get("dp", 1), tp=c.get("tp", 1), pp=c.get("pp", 1), zero=c["zero"],
                 recompute=c.get("recompute", "none"),
                 microbatch=c["batch"] // c.get("dp", 1) if c.get("pp", 1) == 1 else 1)
    setup = Setup(c.get("batch", c.get("dp", 1)), "mixed", "adamw")
    p = predict(spec, lay, setup, cl)
    t = "-" if p.step_seconds != p.step_seconds else \
        f"{p.step_seconds:.3g} s ({p.flops_per_gpu / 1e12:.0f} TFLOP/s/GPU)"
    states = p.memory["parameters"] + p.memory["gradients"] + p.memory["optimizer_state"]
    return ("", "needle.plan", _gb(p.memory["total"]), t,
            f"all categories; model states {_gb(states)}")


def deepspeed_zero(c: Dict[str, Any]) -> Row:
    """DeepSpeed's cold ZeRO-2/3 estimators (model states only, from a parameter count)."""
    if importlib.util.find_spec("deepspeed") is None:
        return ("", "DeepSpeed estimators", "-", "-", "not installed (pip install deepspeed)")
    from deepspeed.runtime.zero import stage3, stage_1_and_2
    psi = c["params"] if "params" in c else model.preset(c["spec"]).num_params
    psi /= c.get("tp", 1) * c.get("pp", 1)
    gpus = c.get("dp", 1)
    with redirect_stdout(io.StringIO()):
        if c["zero"] == 3:
            mem = stage3.estimate_zero3_model_states_mem_needs(
                int(psi), int(psi / 100), min(gpus, 8), max(1, gpus // 8), cpu_offload=False,
                cpu_offload_params=False)[1]
            note = "ZeRO-3: 4 x largest layer (taken as 1 % of Psi) + 18 Psi / N"
        else:
            mem = stage_1_and_2.estimate_zero2_model_states_mem_needs(
                int(psi), min(gpus, 8), max(1, gpus // 8), cpu_offload=False)[1]
            note = "ZeRO-2 formula 2 Psi + 18 Psi / N (also used here for stages 0-1)"
    return ("", "DeepSpeed estimators", _gb(mem), "-", "model states only; " + note)


def accelerate_memory(c: Dict[str, Any]) -> Row:
    """``accelerate estimate-memory`` needs a Hub model id (it downloads the config): skipped."""
    note = ("not installed" if importlib.util.find_spec("accelerate") is None else
            "skipped: needs a Hugging Face Hub model id (downloads its config at run time)")
    return ("", "accelerate estimate-memory", "-", "-",
            note + "; it reports parameter bytes only (x4 for Adam training)")


def llm_analysis(c: Dict[str, Any]) -> Row:
    """llm-analysis' training() on the same shape, GPU and parallelism (no flash attention)."""
    if importlib.util.find_spec("llm_analysis") is None:
        return ("", "llm-analysis", "-", "-", "not installed (pip install llm-analysis)")
    if "spec" not in c:
        return ("", "llm-analysis", "-", "-", "needs a model shape, not a parameter count")
    logging.disable(logging.WARNING)
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
        from llm_analysis.config import (
            ModelConfig,
            ParallelismConfig,
            get_dtype_config_by_name,
            get_gpu_config_by_name,
        )
        s = model.preset(c["spec"])
        mc = ModelConfig(name=s.name, num_layers=s.layers, n_head=s.heads, hidden_dim=s.hidden,
                         vocab_size=s.vocab, max_seq_len=s.seq)
        par = ParallelismConfig(tp_size=c.get("tp", 1), pp_size=c.get("pp", 1),
                                dp_size=c.get("dp", 1))
        a = LLMAnalysis(mc, get_gpu_config_by_name("a100-sxm-80gb"),
                        get_dtype_config_by_name("w16a16e16"), par, flops_efficiency=0.6,
                        hbm_memory_efficiency=0.6)
        rec = {"none": ActivationRecomputation.NONE,
               "selective": ActivationRecomputation.SELECTIVE,
               "full": ActivationRecomputation.FULL}[c.get("recompute", "none")]
        r = a.training(global_batch_size=c["batch"], batch_size_per_gpu=1 if c.get("pp", 1) > 1
                       else c["batch"] // c.get("dp", 1), seq_len=s.seq, flash_attn=False,
                       activation_recomputation=rec, ds_zero=DSZeRO(c["zero"]))
    logging.disable(logging.NOTSET)
    mem = r["(weight+op_state+grad+act)_memory_per_gpu"]
    return ("", "llm-analysis", _gb(mem), f"{r['latency_per_iter']:.3g} s",
            "flops_efficiency 0.6 (as needle.plan's)")


TOOLS: List[Callable[[Dict[str, Any]], Row]] = [needle_plan, deepspeed_zero, accelerate_memory,
                                                 llm_analysis]


def main() -> None:
    """Print the Markdown table."""
    print("| configuration | tool | GB per GPU | step time | note | published |")
    print("|---|---|---|---|---|---|")
    for name, c in CONFIGS.items():
        for k, tool in enumerate(TOOLS):
            try:
                _, t, mem, step, note = tool(c)
            except Exception as err:  # noqa: BLE001 (an optional tool failing is reported)
                t, mem, step, note = tool.__name__, "-", "-", f"failed: {err!r}"
            print(f"| {name if k == 0 else ''} | {t} | {mem} | {step} | {note} | "
                  f"{c['published'] if k == 0 else ''} |")


if __name__ == "__main__":
    main()
