"""``scalerun tune``: the fastest launch settings for a script, found by measuring.

:mod:`~scalerun.tune.space` lists the configurations, :mod:`~scalerun.tune.trials` runs and
records one, :mod:`~scalerun.tune.search` halves the field under a budget,
:mod:`~scalerun.tune.validate` checks the winner against the defaults and
:mod:`~scalerun.tune.tuner` ties them together and writes ``tune.json``. Never imports torch.
"""
