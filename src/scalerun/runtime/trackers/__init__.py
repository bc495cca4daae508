"""Experiment trackers (``--track mlflow|wandb|tensorboard``): rank 0 sends the run to them.

Why here, in the rank: the numbers a tracker shows are the step log's (the user's
``scalerun.log`` scalars, the phase times, samples/s), and the step log hands every record
it writes to a sink (:func:`scalerun.runtime.trackers.sink.sink_for_rank`), so a tracker
needs no second logging call in the training loop. The launcher, which alone knows when
the whole job has ended, attaches the job report afterwards (:mod:`scalerun.launch.trackers`)
to the runs rank 0 recorded in ``RUN_DIR/trackers.json``.

- :mod:`.registry`     the small protocol each tracker follows, and the names -> modules
- :mod:`.sink`         the step log's sink: starts the chosen trackers, sends records
- :mod:`.mlflow`, :mod:`.wandb`, :mod:`.tensorboard`  one module per tracker

Each tracker's package is an optional extra, imported only when that tracker is chosen.
"""
