"""The public runtime functions, gathered for ``scalerun.<name>``."""

from scalerun.runtime.context import barrier, context, shutdown
from scalerun.runtime.data import loader
from scalerun.runtime.init import init
from scalerun.runtime.metrics import reduce
from scalerun.runtime.output import print
from scalerun.runtime.steplog import log
from scalerun.runtime.wrap import wrap

__all__ = ["init", "wrap", "loader", "reduce", "print", "shutdown", "barrier", "context", "log"]
