"""``python -m needle.plan``: which parallelism to use, with predictions checked against runs."""
from . import cluster, model
from .layout import Layout, Setup
from .predict import Prediction, predict
from .rank import plan

__all__ = ["plan", "predict", "Prediction", "Layout", "Setup", "model", "cluster"]
