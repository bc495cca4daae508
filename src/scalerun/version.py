"""scalerun's version, in a module that imports nothing.

Why not only ``scalerun.__version__``: the package's ``__init__`` exposes the runtime API,
so a low module (checkpoints, the doctor's version report) that imported the version
from it would import upwards. Everything reads it from here; ``__init__`` re-exports it.
"""

__version__ = "0.1.0"
