"""Every name that the plan, the launchers and the ranks share: ``SCALERUN_*`` variables and
run-directory file names.

Why one module: a launcher writes these names (into a rank's environment, a job script,
the run directory) and the runtime inside each rank reads them, often on another machine
and sometimes from another scalerun version's job script. A name spelled twice drifts.
Every other module imports its names from here; ``tests/test_architecture.py`` fails
when a ``SCALERUN_`` string appears anywhere else.

This module holds strings only. It imports nothing, so any layer may import it (the
runtime included, which must never import ``launch/`` or ``commands/`` to borrow one).
"""

from __future__ import annotations

PREFIX = "SCALERUN_"
"""What the name of every variable of scalerun's begins with."""

# --- where a rank plans from ------------------------------------------------------------

SITE = "SCALERUN_SITE"
"""The site profile's name or path; job scripts export it so ranks plan with the launch's site."""
SITE_FILE = "SCALERUN_SITE_FILE"
"""The launch's site profile as it was when the launch was planned, frozen in the run
directory (:data:`SITE_RUN_FILE`): ranks plan with it, wherever they run (an image sees
neither the user's profile folders nor a ``--site`` file)."""
SYSFS = "SCALERUN_SYSFS"
"""The sysfs root to read the node from (``/`` in production, a fixture tree in tests)."""
BACKEND = "SCALERUN_BACKEND"
"""The process-group backend the launch asked for (``--backend``)."""
BIND = "SCALERUN_BIND"
"""``0`` keeps a rank from applying its CPU set (``init(bind=False)`` does the same)."""
HYPERTHREADS = "SCALERUN_HYPERTHREADS"
"""``1``: ranks also get the sibling hardware threads of their cores (``--hyperthreads``)."""
MEMBIND = "SCALERUN_MEMBIND"
"""``1``/``0``: memory policy on/off (``--membind``/``--no-membind``); unset: the plan's rule."""
NETCONF = "SCALERUN_NETCONF"
"""``0`` keeps the plan's communication, thread and cache variables out of the rank."""
MALLOC = "SCALERUN_MALLOC"
"""``0`` keeps the plan's glibc malloc tunables out of CPU ranks."""
VERBOSE = "SCALERUN_VERBOSE"
"""``1``: every rank prints one placement line at start (``-v``)."""
WARM_CACHE = "SCALERUN_WARM_CACHE"
"""The folder of the warm JIT-cache copies (``~`` expands on the node); unset or ``off``:
none (``--no-warm-cache``). See :mod:`scalerun.netconf.warm_cache`."""
WARM_CACHE_GB = "SCALERUN_WARM_CACHE_GB"
"""The size cap of all warm copies together, in GB (the site's ``warm_cache_gb``)."""
KNOBS = "SCALERUN_KNOBS"
"""Tuned defaults (``threads=1,loader_workers=2``) from ``scalerun launch --knob`` or a
site's ``[env]``; :mod:`scalerun.plan.knobs` reads them, ``wrap()``/``loader()`` use them."""
TIMEOUT = "SCALERUN_TIMEOUT"
"""Seconds a collective may wait before it fails (``init(timeout=...)``)."""

# --- what a rank does for the launch ----------------------------------------------------

RUN_DIR = "SCALERUN_RUN_DIR"
"""The run directory: step logs, monitor samples, profiles, stacks (set by every launcher)."""
RUNS = "SCALERUN_RUNS"
"""The folder default run directories go in (``runs`` in the current folder)."""
HANG_TIMEOUT = "SCALERUN_HANG_TIMEOUT"
"""Seconds without progress before a rank writes its stacks and ends (0: never)."""
CHECKPOINT = "SCALERUN_CHECKPOINT"
"""Where ranks save when warned or terminated, and resume from (``--checkpoint``)."""
DEEPSPEED_CONFIG = "SCALERUN_DEEPSPEED_CONFIG"
"""The run's DeepSpeed config file (``--deepspeed-config``), for ``wrap`` and the doctor."""
MAX_STEPS = "SCALERUN_MAX_STEPS"
"""End the run cleanly after this many optimizer steps (``scalerun scaling --steps``)."""
PROFILE_RANKS = "SCALERUN_PROFILE_RANKS"
"""The ranks ``--profile-ranks`` chose: ``0,5`` or ``first-per-node``."""
PROFILER = "SCALERUN_PROFILER"
"""``torch`` (inside the rank) or a command prefix such as ``nsys profile``."""
PROFILE_SCHEDULE = "SCALERUN_PROFILE_SCHEDULE"
"""torch.profiler's wait, warm-up and active steps, ``2,1,3``."""
TENSORBOARD = "SCALERUN_TENSORBOARD"
"""``all``: every rank writes TensorBoard events, not only rank 0 (``--tensorboard all``);
``rank0`` (job scripts of earlier versions) alone also means ``--track tensorboard``."""
TRACK = "SCALERUN_TRACK"
"""``mlflow,wandb,tensorboard``: the experiment trackers rank 0 sends the run to (``--track``)."""
MONITOR = "SCALERUN_MONITOR"
"""``0`` turns the node sampler off (``--no-monitor``)."""
MONITOR_INTERVAL = "SCALERUN_MONITOR_INTERVAL"
"""Seconds between node samples."""
STEP_HOOKS = "SCALERUN_STEP_HOOKS"
"""``1``: every optimizer step goes into the step log, whatever the loop (torch's global
optimizer hooks, installed in ranks that do not import scalerun by ``scalerun exec``);
``0`` turns them off."""
LOCAL_AGENT = "SCALERUN_LOCAL_AGENT"
"""``torch``: a one-node local launch without restarts runs its ranks under torch elastic's
agent, as launches with restarts or several nodes do; by default scalerun starts and
watches them itself, without importing torch (``scalerun/launch/local/direct.py``)."""
LINES_PREFIXED = "SCALERUN_LINES_PREFIXED"
"""``1``: the launcher prefixes each of this rank's lines itself (srun mode on several
nodes, mpirun); torch elastic's prefix template says so for local launches. A rank's
uncaught exception then prints without torch's own ``[rankN]: `` in front."""
START = "SCALERUN_START"
"""``exec``: local ranks start on their own, as before the warm start; the default of
``scalerun launch --start`` (``warm``: forked from one starter per node)."""

ALL = (
    SITE, SITE_FILE, SYSFS, BACKEND, BIND, HYPERTHREADS, MEMBIND, NETCONF, MALLOC, VERBOSE, TIMEOUT,
    RUN_DIR, RUNS, HANG_TIMEOUT, CHECKPOINT, DEEPSPEED_CONFIG, MAX_STEPS, PROFILE_RANKS,
    PROFILER, PROFILE_SCHEDULE, TENSORBOARD, TRACK, MONITOR, MONITOR_INTERVAL, STEP_HOOKS,
    WARM_CACHE, WARM_CACHE_GB, LOCAL_AGENT, START, LINES_PREFIXED,
)
"""Every variable above, for ``scalerun env`` and the tests."""

TORCH_PREFIX_TEMPLATE = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
"""torch elastic's own name (not scalerun's): the prefix template of each line a rank
prints; local launches give it to their ranks, so where it is set the launcher prefixes
the lines (the runtime reads it to leave torch's own traceback prefix out)."""

STORE_FD = "SCALERUN_STORE_FD"
"""Set by the launcher, never by a user: the number of an inherited socket, bound to
``MASTER_ADDR:MASTER_PORT``, that rank 0 serves the rendezvous store on. A one-node launch
without torch elastic's agent holds the port from the moment it picks it until rank 0
listens (``launch/local/direct.py``, ``runtime/store.py``)."""
WATCHDOG_PID = "SCALERUN_WATCHDOG_PID"
"""Set by a rank, never by a user: the pid of the process whose hang watchdog watches
this rank. A process it starts later (a spawned loader worker, which imports torch too)
inherits it and starts no watchdog of its own: one rank, one watchdog, one stack file."""
STARTER_FD = "SCALERUN_STARTER_FD"
"""Set by the launcher for its warm starter, never by a user: the number of the inherited
Unix socket the starter takes its ranks from (``launch/local/wire.py``)."""
STANDBY = "SCALERUN_STANDBY"
"""A folder of standby starters (``launch/local/standby.py``), set by a process that starts
many launches (``standby_link.standbys``): launches below it fork their warm starter from
a standby with the same key instead of importing torch again."""

# --- the run directory (paths are built by :mod:`scalerun.rundir`) -----------------------

STEPS_DIR = "steps"
"""``RUN_DIR/steps/rank-<R>.jsonl``: the step log of rank R."""
MONITOR_DIR = "monitor"
"""``RUN_DIR/monitor/<node>.jsonl`` (samples) and ``<node>.ranks`` (the node's rank pids)."""
PROFILE_DIR = "profile"
"""``RUN_DIR/profile/rank-<R>/``: traces of a profiled rank."""
TENSORBOARD_DIR = "tensorboard"
"""``RUN_DIR/tensorboard/``: TensorBoard event files."""
TRACK_CONFIG_FILE = "track-config.json"
"""The run's configuration as the plan decided it (command, sizes, site, the ranks'
variables with secrets masked): what ``--track`` sends to each tracker as parameters."""
TRACKERS_FILE = "trackers.json"
"""Rank 0 records here how to find its tracker runs again (MLflow's run id and tracking
URI, W&B's run id and folder); the launcher attaches the job report to them after the job."""
STACKS_DIR = "stacks"
"""``RUN_DIR/stacks/rank-<R>.txt``: Python stacks written when a hang is detected."""
FLIGHT_DIR = "fr"
"""``RUN_DIR/fr/rank-<R>.json``: torch's flight recorder, dumped by a rank's hang watchdog."""
LOGS_DIR = "logs"
"""``RUN_DIR/logs/``: library debug logs (``--debug``)."""
RUN_FILE = "run.json"
"""What was launched: command, sizes, start time (secrets masked)."""
JOB_SCRIPT_FILE = "job.sbatch"
"""The job script of a SLURM launch."""
SITE_RUN_FILE = "site.json"
"""The launch's site profile, merged and validated, as ranks read it (:data:`SITE_FILE`)."""
STARTS_FILE = "starts.jsonl"
"""``RUN_DIR/starts.jsonl``: how each local launcher started its ranks (warm or exec, forked
by a standby or leaving one, the starter's seconds to ready), one JSON object a start:
what a cold first launch paid once, which ``scalerun tune`` must not charge every trial."""
EVENTS_FILE = "events.jsonl"
"""``RUN_DIR/events.jsonl``: what happened during the run (stragglers, restarts,
preemption, hangs), one JSON object per line; see :mod:`scalerun.events`."""
STOPPED_FILE = "stopped-on-signal"
"""Rank 0 writes its checkpoint's path here after the ranks stopped on a signal; the job
script requeues (or ends cleanly) on it."""
