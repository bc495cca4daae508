"""Found first on a rank's path (``scalerun exec`` puts this folder there): arms the
step-log hooks when the script imports torch (:mod:`scalerun.runtime.autoarm`), then runs
the ``sitecustomize`` the interpreter would have run without this folder.

Never raises: a failure is one line on stderr, and the user's script starts regardless.
"""

import sys

try:
    from scalerun.runtime import autoarm

    autoarm.arm_after_torch()
    autoarm.unprefixed_tracebacks()
    autoarm.hand_over()
except Exception as error:  # noqa: BLE001 - the user's script must start regardless
    print(f"scalerun: no step log hooks in this process ({type(error).__name__}: {error})",
          file=sys.stderr, flush=True)
