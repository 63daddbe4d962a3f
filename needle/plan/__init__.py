"""``python -m needle.plan``: which parallelism to use, with predictions checked against runs.

    from needle.plan import plan, model, cluster, Setup
    preds = plan(model.preset("gpt3-175b"), Setup(batch=1536),
                 cluster.preset("dgx-a100-80g", nodes=128))
    print(preds[0].layout.describe(), preds[0].step_seconds)
"""
from . import cluster, model
from .layout import Layout, Setup
from .predict import Prediction, predict
from .rank import plan

__all__ = ["plan", "predict", "Prediction", "Layout", "Setup", "model", "cluster"]
