"""The parameter server (Li et al., OSDI 2014) with BSP, SSP (Ho et al., NeurIPS 2013) and ASP."""
from .consistency import CONSISTENCY, ClockTable, staleness_of
from .messages import ParameterServerError
from .parameter_server import ParameterServer
from .server import ServerEvent
from .worker import train_worker

__all__ = ["ParameterServer", "ParameterServerError", "ServerEvent", "ClockTable",
           "CONSISTENCY", "staleness_of", "train_worker"]
