"""The environment the collective library and the JIT caches need, decided in one place.

Each decision is a :class:`~scalerun.netconf.settings.Setting` that knows its source
(the user's own environment, the site profile, the topology, a default) and why, so
``scalerun env --explain``, the launchers and ``scalerun doctor`` show and apply the same
values. Nothing here writes the environment of the current process by itself.
"""
