"""SLURM job text: a job description in, ``srun`` words and ``sbatch`` script text out.

Why: users of the course material hand-write ``#SBATCH`` headers, escape
``\\$SLURM_PROCID`` inside ``bash -c``, guess ``MASTER_ADDR`` and wrap every line in
``singularity exec``. Here the job is data (:class:`~scalerun.launch.slurm.job.SlurmJob`,
from the plan) and one pure, deterministic function (:func:`render_sbatch`) writes the
script, so the same job always gives the same text and every rule is tested once.

This module decides the order of the script's parts, the ``srun`` options of each mode,
and how every word is quoted (:func:`shell_quote`, the only quoting helper). It never
runs a process, reads the environment or touches a file; which values an ``#SBATCH``
line may carry is :mod:`scalerun.launch.slurm.job`'s rule; quoting is :mod:`scalerun.shell`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from scalerun import variables
from scalerun.errors import LaunchError
from scalerun.launch.container import exec_words
from scalerun.launch.prefix import rank_prefix
from scalerun.launch.slurm.job import SlurmJob, parse_sbatch_arg
from scalerun.plan.launch import exec_bind_words
from scalerun.redact import is_secret_name, redact_words
from scalerun.shell import ShellRef, Word, expand_template, shell_quote, shell_template

# --- words -------------------------------------------------------------------------------


def program_words(job: SlurmJob) -> list[Word]:
    """What each task runs inside the container (if any): the script, or torchrun on it."""
    target = {"file": [job.script], "module": ["-m", job.script], "executable": [job.script]}[
        job.entry
    ]
    if job.mode == "srun":
        start = [] if job.entry == "executable" else [job.python]
        return [*start, *target, *job.script_args]
    torchrun_target = {
        "file": [job.script],
        "module": ["--module", job.script],
        "executable": ["--no-python", job.script],
    }[job.entry]
    agent: list[Word] = ["-m", "torch.distributed.run"]
    if job.start == "warm" and (job.entry != "executable" or python_code(job)):
        # the node's ranks forked from one starter (restarts too); a program that does not
        # bind itself is bound by each forked rank, as scalerun exec --bind would
        agent = ["-m", "scalerun.launch.local.elastic_run",
                 *([f"--scalerun-preload={','.join(job.preload)}"] if job.preload else []),
                 *(["--scalerun-binds"] if job.bind_workers else [])]
    elif job.bind_workers:  # a program that does not bind itself: scalerun exec does it
        torchrun_target = ["--no-python", *exec_bind_words(job.python, job.script, job.entry)]
    return [
        job.python,
        *agent,
        node_count_word(job, "--nnodes="),
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        "--rdzv-id",
        ShellRef("SLURM_JOB_ID"),
        "--rdzv-endpoint",
        ShellRef("RDZV_ENDPOINT"),
        *([f"--max-restarts={job.max_restarts}"] if job.max_restarts else []),
        *torchrun_target,
        *job.script_args,
    ]


def python_code(job: SlurmJob) -> bool:
    """The job's program is ``python -c CODE`` (the check): the warm start takes it too."""
    return job.entry == "executable" and job.script == job.python and job.script_args[:1] == ("-c",)


def exec_wrapper_words(job: SlurmJob, python: str | None = None) -> list[Word]:
    """``scalerun exec``: exports RANK/LOCAL_RANK/... and the per-task variables, decides the
    rank's environment and profiler, then execs. In torchrun mode it also tells each node's
    agent whether it hosts the c10d store. ``python``: the interpreter that runs it (the
    image's, inside a container, where scalerun is brought in); default the host's."""
    words: list[Word] = [python or job.host_python, "-m", "scalerun", "exec"]
    if job.mode == "torchrun":
        words.append("--torchrun-agent")
    for name, value in job.task_env:
        if not is_secret_name(name):  # a secret is exported by the script (see _environment)
            words += ["--env", f"{name}={value}"]
    return [*words, "--"]


def host_side_words(job: SlurmJob) -> list[Word]:
    """In front of the container: ``scalerun exec --host-side`` on the host starts the node's
    sampler (it reads the host's tools) and nothing else. Everything the rank gets is
    decided inside the image, by ``scalerun exec`` under the image's python, with the
    image's libraries and versions (GPU-direct by the image's ROCm, the profiler in the
    image): the rank runs there."""
    return [job.host_python, "-m", "scalerun", "exec", "--host-side", "--"]


def node_count_word(job: SlurmJob, option: str) -> Word:
    """``--nodes=2``; with ``--nodes MIN-MAX`` the count the job got, read when it runs
    (a requeued job may come back on another count): the steps, the ranks' placement and
    torchrun's rendezvous all follow it."""
    if job.resources.varies:
        return ShellRef("SLURM_JOB_NUM_NODES", when_set=option)
    return f"{option}{job.resources.nodes}"


def srun_option_words(job: SlurmJob) -> list[Word]:
    """Every srun option spelled out: srun in a batch script does not inherit them all."""
    res = job.resources
    options = [node_count_word(job, "--nodes="), f"--ntasks-per-node={res.ntasks_per_node}"]
    if res.cpus_per_task:
        options.append(f"--cpus-per-task={res.cpus_per_task}")
    if res.gpus_per_node:
        options.append(f"--gpus-per-node={res.gpus_per_node}")
    # One failed rank must end the step: the others would wait in a collective forever.
    return options + ["--kill-on-bad-exit=1"]


def cpu_bind_words(job: SlurmJob) -> list[Word]:
    """srun's ``--cpu-bind``: as given, else the plan the script computed (when it could);
    always verbose, so that the job log shows SLURM's view of each task's CPUs beside
    scalerun's (the course's ``--cpu-bind=v,mask_cpu:...``)."""
    if job.cpu_bind:
        given = job.cpu_bind.split(",")
        return [f"--cpu-bind={job.cpu_bind}" if {"v", "verbose"} & set(given) else
                f"--cpu-bind=verbose,{job.cpu_bind}"]
    if job.mode == "srun":
        return [ShellRef("CPU_BIND", joined_to="--cpu-bind=verbose")]
    return ["--cpu-bind=verbose"]


def srun_groups(job: SlurmJob) -> list[list[Word]]:
    """The srun command in readable groups: srun, each option, wrapper, container, program."""
    options: list[Word] = [*srun_option_words(job), *cpu_bind_words(job)]
    groups: list[list[Word]] = [["srun"]] + [[option] for option in options]
    if warned(job):
        groups.append(list(IGNORE_WARNING))
    if job.prefix_lines:
        groups.append(list(PREFIX_LINES))
    if job.container:
        groups.append(host_side_words(job))
        groups.append(list(exec_words(job.container)))
        groups.append(exec_wrapper_words(job, job.python))
    else:
        groups.append(exec_wrapper_words(job))
    groups.append(program_words(job))
    return groups


IGNORE_WARNING = ("bash", "-c", 'trap "" USR1; exec "$@"', "ignore-usr1")
"""Each task starts with SIGUSR1 ignored, which exec and fork keep: srun hands the warning
to every process of the step, and torchrun's agent, data-loader workers, the node sampler
and programs that do not listen for it would die of it; scalerun ranks (and programs
that do listen) install their own handler."""


SRUN_PREFIX = rank_prefix("$SLURM_PROCID", "${SLURMD_NODENAME%%.*}")
"""The prefix (:mod:`scalerun.launch.prefix`) as bash spells it in an srun task: its rank
and its node's short name."""

PREFIX_LINES = ("bash", "-c", f'p="{SRUN_PREFIX}"; export {variables.LINES_PREFIXED}=1; exec "$@" > >(exec sed -u "s/^/$p/") '
                f'2> >(exec sed -u "s/^/$p/" >&2)', "prefix-lines")
"""Each task's stdout and stderr through ``sed``, which puts ``[rankN node]: `` in front of
every line (issue 20, torch issue 75087): srun's ``--label`` says only the task number, and
a job log of many nodes must say where a line came from. The task itself is the program
(``exec``), so srun's signals and exit code are its own; ``sed -u`` writes each line as it
comes."""


def warned(job: SlurmJob) -> bool:
    """True when SLURM warns the job script before its time limit (``--signal-before``)."""
    return job.preemption is not None and job.preemption.signal_before_s is not None


def srun_command(job: SlurmJob) -> list[Word]:
    return [word for group in srun_groups(job) for word in group]


# --- script text ---------------------------------------------------------------------------


def render_sbatch(job: SlurmJob) -> str:
    """The whole job script; pure and deterministic (same job, same text)."""
    sections = [
        _header(job),
        _environment(job),
        _warning_trap(job),
        _setup(job),
        _launch(job),
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _header(job: SlurmJob) -> str:
    lines = [
        "#!/bin/bash",
        "# Written by scalerun; submit with: sbatch THIS_FILE",
    ]
    if job.command_line:
        lines.append(
            "# from: "
            + _one_line(" ".join(shell_quote(word) for word in redact_words(job.command_line)))
        )
    lines.append(f"# site: {job.site}")
    lines += ["#", "# --- resources ---", *job.resources.directives()]
    extra = job.resources.extra_directives()
    if extra:
        lines += ["# --- extra options (--sbatch-arg, site) ---", *extra]
    if job.preemption is not None:
        lines += ["# --- before the time limit (--signal-before, --requeue) ---",
                  *job.preemption.directives()]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """Comments must stay one line: newlines in shown arguments become \\n."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _environment(job: SlurmJob) -> str:
    lines = ["set -eo pipefail"]
    module_use = job.module_use
    modules = job.modules
    if module_use or modules:
        lines += ["", "# --- software modules ---"]
        lines += [f"module use {shell_quote(folder)}" for folder in module_use]
        lines += [f"module load {shell_quote(module)}" for module in modules]
    lines += _container_modules(job)
    if job.site_env:
        lines += ["", f"# --- site {job.site} environment (kept when already set) ---"]
        for name, value in job.site_env:
            lines += _secret_lines(name) if is_secret_name(name) else [
                f"[[ -v {name} ]] || export {name}={shell_template(value)}"]
    if job.env:
        lines += ["", "# --- environment (--env) ---"]
        for name, value in job.env:
            lines += _secret_lines(name) if is_secret_name(name) else [
                f"export {name}={shell_template(value)}"]
    checked = {name for name, _ in (*job.site_env, *job.env)}
    referenced = [name for name in job.secret_args if name not in checked]
    if referenced:
        lines += ["", "# --- secrets the script's arguments refer to (their values are not written here) ---"]
        for name in referenced:
            lines += _secret_lines(name)
    return "\n".join(lines)


def _container_modules(job: SlurmJob) -> list[str]:
    """The site's container modules, with the mounts written out as their fallback: the
    module knows what this system's images need; the list may be out of date."""
    box = job.container
    if not box or not box.modules:
        return []
    variable = f"{box.runtime.upper()}_BIND"
    fallback = ",".join(box.fallback_mounts)
    lines = ["", "# --- container bindings: the site's module, else its mounts written out ---"]
    lines += [f"module use {shell_quote(folder)}" for folder in box.module_use]
    for module in box.modules:
        lines += [f"if ! module load {shell_quote(module)}; then",
                  f"    echo {shell_quote(f'scalerun: module {module} is missing: binding the site mounts instead')} >&2"]
        if fallback:
            lines.append(f'    export {variable}="${{{variable}:+${{{variable}}},}}"{shell_quote(fallback)}')
        lines.append("fi")
    return lines


def _secret_lines(name: str) -> list[str]:
    """A secret (:func:`scalerun.redact.is_secret_name`) is never written into the script:
    it comes from the submitting shell, which sbatch exports into the job by default and
    to which ``scalerun launch`` adds it (:func:`secret_handoff`); the job stops at once,
    naming it, when it did not arrive."""
    return [
        f"# {name}: a secret, taken from the shell that submits this script; its value is not written here",
        f': "${{{name}?is not set: export {name} in the shell that runs sbatch}}"',
        f"export {name}",
    ]


def secret_handoff(job: SlurmJob, environ: Mapping[str, str]) -> dict[str, str]:
    """The secrets the script takes from its submitter, as ``sbatch`` must receive them.

    ``--env`` values expand here, from the submitting environment (``${VAR}`` as in the
    script); a site's secret is handed only where that environment lacks it, as the
    script's ``[[ -v NAME ]]`` rule would have kept the user's own value."""
    handed: dict[str, str] = {}
    for name, value in job.site_env:
        if is_secret_name(name) and name not in environ:
            handed[name] = expand_template(value, environ, what=f"site variable {name}")
    for name, value in job.env:
        if is_secret_name(name):
            handed[name] = expand_template(value, {**environ, **handed}, what=f"--env {name}")
    for name in job.secret_args:  # in the submitting environment already: it must reach the job
        if name not in handed and name in environ:
            handed[name] = environ[name]
    return handed


def check_secrets_exported(job: SlurmJob, names: Iterable[str], environ: Mapping[str, str]) -> None:
    """Refuse, before submitting, an ``--export`` that would keep a handed secret out of the job
    (the script would stop at its first line instead, after waiting in the queue)."""
    given = [value for name, value in map(parse_sbatch_arg, job.resources.extra) if name == "export"]
    value = environ.get("SBATCH_EXPORT") or (given[-1] if given else None)  # sbatch's precedence
    if not value:
        return
    parts = value.split(",")
    for name in names:
        if "ALL" not in parts and not any(p == name or p.startswith(f"{name}=") for p in parts):
            raise LaunchError(
                f"{name} is handed to the job through sbatch's environment, but --export={value} "
                f"keeps it out; add {name} (or ALL) to --export"
            )


def _setup(job: SlurmJob) -> str:
    if not job.setup:
        return ""
    return "\n".join(["# --- set-up commands (--setup, site) ---", *job.setup])


def _launch(job: SlurmJob) -> str:
    res = job.resources
    lines = _run_dir_lock(job) + _cache_cleanup_trap(job)
    if job.mode == "torchrun":
        lines += [
            "# --- rendezvous: torchrun's c10d store on the first node, port fixed by the job id ---",
            f"RDZV_ENDPOINT=$({shell_quote(job.host_python)} -m scalerun exec --rendezvous)",
            "",
        ]
    if job.mode == "srun" and not job.cpu_bind:
        planner = [job.host_python, "-m", "scalerun", "exec", "--srun-cpu-bind", str(res.ntasks_per_node)]
        lines += [
            "# --- CPU binding: each rank on the cores nearest its GPU, from the node plan of",
            "# this node and site (scalerun topo shows it); srun repeats the masks on every node",
            "# (empty: left to SLURM) ---",
            f"CPU_BIND=$({' '.join(shell_quote(word) for word in planner)})",
            "",
        ]
    lines += _check_step(job)
    ranks = (f"{job.nproc_per_node} x SLURM_JOB_NUM_NODES" if res.varies
             else str(res.nodes * job.nproc_per_node))
    how = {
        "srun": "one task per GPU; scalerun exec gives each rank RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...",
        "torchrun": "one task per node, torchrun starts the ranks and sets their variables",
    }[job.mode]
    lines += [
        f"# --- launch: {ranks} ranks, {job.nproc_per_node} per node on {res.node_count} node(s) ---",
        f"# {how}",
    ]
    if job.bind_workers:
        lines.append("# the script does not call scalerun.init(): scalerun exec --bind gives each "
                     "rank its cores and variables")
    rendered = [" ".join(shell_quote(word) for word in group) for group in srun_groups(job)]
    lines += _training_step(job, " \\\n    ".join(rendered))
    return "\n".join(lines)


def _warning_trap(job: SlurmJob) -> str:
    """From its first command on, the script hears SLURM's warning (without a trap bash
    would die of it) and, while the training step runs, passes it on to srun, which
    signals every process of the step (SLURM 22.05+, with either process tracker)."""
    if not warned(job):
        return ""
    assert job.preemption is not None
    seconds = job.preemption.signal_before_s
    return "\n".join([
        f"# --- the warning: SLURM sends USR1 to this script {seconds} s before the time limit;",
        "# the ranks finish their step, all save a checkpoint, and rank 0 writes STOPPED",
        "# (scalerun.runtime.preempt) ---",
        f"STOPPED={shell_quote(job.preemption.stopped_file)}",
        'rm -f "$STOPPED"',
        "step=''",
        "signalled=0",
        "forward_warning() {",
        "    signalled=1",
        '    if [[ -n $step ]]; then kill -USR1 "$step" 2>/dev/null || true; fi',
        "}",
        "trap forward_warning USR1",
    ])


def _training_step(job: SlurmJob, command: str) -> list[str]:
    """The srun command; with the warning, run in the background (bash runs a trap only
    between commands, and a wait cut short by one returns 128+10), then requeued or
    ended cleanly when the ranks stopped with a checkpoint. With ``--track``, the report
    step follows it whatever its exit code, and the script ends with the step's code; so
    does the warm-cache save of a program without ``init()``."""
    if not warned(job):
        if not job.trackers and not job.save_warm_cache:
            return [command]
        return ["code=0", f"{command} || code=$?", *_warm_save_step(job), *_attach_step(job), 'exit "$code"']
    assert job.preemption is not None
    lines = [
        f"{command} &",
        "step=$!",
        "while :; do",
        "    signalled=0 code=0",
        '    wait "$step" || code=$?',
        "    (( signalled && code > 128 )) || break  # the trap interrupted the wait: wait again",
        "done",
        *_warm_save_step(job),
        *_attach_step(job),
        "if [[ -f $STOPPED ]]; then",
    ]
    if job.preemption.requeue:
        lines += [
            "    # --- requeue: this job starts again, and its ranks resume from the checkpoint ---",
            '    echo "scalerun: saved $(<"$STOPPED"); job ${SLURM_JOB_ID} requeues itself '
            '(restart $(( ${SLURM_RESTART_COUNT:-0} + 1 )))"',
            "    trap - EXIT; remove_job_caches  # the requeued job may start on other nodes",
            '    scontrol requeue "$SLURM_JOB_ID"  # SLURM ends this script here',
        ]
    else:
        lines.append(
            '    echo "scalerun: job ${SLURM_JOB_ID} stopped cleanly before its time limit; '
            'checkpoint $(<"$STOPPED"); submit this script again to continue"'
        )
    return lines + ["    exit 0", "fi", 'exit "$code"']


LOCK_CONFLICT = 75
"""``flock -E``: the exit code that means "held by another", told apart from a file system
without locks (the job then goes on unguarded, as a local launch does)."""


def _run_dir_lock(job: SlurmJob) -> list[str]:
    """The job holds its run directory's lock while its script runs, as a local launcher
    does (:mod:`scalerun.launch.run_lock`): a second live launch into the folder is refused
    in one line. A requeue of the job takes it again; the kernel drops it when the script
    ends. The launch that submitted refused already when the lock was held at submit time;
    this catches a job that starts while another launch into the folder still runs."""
    if job.run_dir is None:
        return []
    from scalerun.launch.run_lock import lock_path

    lock = shell_quote(str(lock_path(job.run_dir)))
    folder = shell_quote(str(job.run_dir))
    return [
        "# --- one live launch per run directory: this job holds its lock while it runs ---",
        "# (no flock, or a lock file that cannot be opened: the job goes on unguarded)",
        f"if command -v flock >/dev/null && {{ exec 9>>{lock}; }} 2>/dev/null; then",
        f"    if flock -n -E {LOCK_CONFLICT} 9; then",
        f'        echo "job ${{SLURM_JOB_ID}} on $(hostname) since $(date \'+%F %T\')" > {lock}',
        f"    elif [[ $? == {LOCK_CONFLICT} ]]; then",
        f'        echo "scalerun: --run-dir "{folder}" is in use by a live launch ($(<{lock})); submit '
        'again once it ended, or with another --run-dir" >&2',
        "        exit 1",
        "    fi",
        "fi",
        "",
    ]


CACHE_CLEANUP_PROGRAM = ("import os; from scalerun.netconf.caches import remove_job_caches; "
                         "remove_job_caches(os.environ)")
"""What one task per node runs when the job script ends: the node's per-job JIT cache
folders out of ``/tmp`` (:func:`scalerun.netconf.caches.remove_job_caches`)."""


def cache_cleanup_command(job: SlurmJob) -> list[Word]:
    """One task on every node of the job (the count it got, for ``--nodes MIN-MAX``)."""
    return ["srun", "--overlap", "--mem=0", node_count_word(job, "--nodes="), node_count_word(job, "--ntasks="),
            "--ntasks-per-node=1", "--cpu-bind=none", job.host_python, "-c", CACHE_CLEANUP_PROGRAM]


def _cache_cleanup_trap(job: SlurmJob) -> list[str]:
    """When the script ends, however it ends (the check failed, the training failed, it
    ran to the end), one task per node removes the node's cache folders of this job: they
    are named by its id, so no later job reads them, and the warm copy has taken what they
    held (rank 0 or the save step saved before the script's end). A job that SLURM kills
    outright leaves them, as it leaves the rest of its ``/tmp``. ``--overlap``: a step of
    the job may still be ending and hold its CPUs. ``--mem=0``: inside the script srun
    reads the job's ``SLURM_MEM_PER_CPU`` and asks that much again, which a step still
    ending may hold (``--overlap`` does not share memory on SLURM 22.05: "Memory required
    by task is not available", seen in CI); a step with ``--mem=0`` takes none of the
    job's memory from other steps. The step never changes the job's exit code."""
    return [
        "# --- when this script ends: each node's JIT cache folders of this job out of /tmp",
        "# (named by the job id, no later job reads them; the warm copy keeps what they held) ---",
        "remove_job_caches() {",
        "    " + " ".join(shell_quote(word) for word in cache_cleanup_command(job)) + " || true",
        "}",
        "trap remove_job_caches EXIT",
        "",
    ]


WARM_SAVE_PROGRAM = (
    "import os\n"
    "from scalerun.runtime.warm import save_for_node\n"
    "save_for_node(os.environ, 'scalerun')\n"
)
"""What the batch script runs on its node (the first, where rank 0 ran) after the ranks of a
program without ``init()`` ended: the node's JIT caches back to the warm copy."""


def _warm_save_step(job: SlurmJob) -> list[str]:
    """A program that does not call ``init()`` has its caches restored by ``scalerun exec``
    but no rank that saves them: the script does, as the local launcher does
    (:func:`scalerun.runtime.warm.save_for_node`). It never changes the job's exit code."""
    if not job.save_warm_cache:
        return []
    return [
        "# --- the first node's JIT caches back to the warm copy (the program has no init()) ---",
        f"{shell_quote(job.host_python)} -c {shell_quote(WARM_SAVE_PROGRAM)} || true",
    ]


def _attach_step(job: SlurmJob) -> list[str]:
    """``--track``: once every rank has ended (srun has returned, the node samplers with
    it), the job report goes to the trackers' runs rank 0 recorded. The script does it,
    not the launcher: a job submitted without ``--wait`` has no launcher left to do it.
    It never changes the job's exit code."""
    if not job.trackers:
        return []
    report = [job.host_python, "-m", "scalerun", "report", str(job.run_dir or "."), "--attach"]
    return [
        "# --- --track: the job report to the trackers' runs, once every rank has ended ---",
        " ".join(shell_quote(word) for word in report) + " || true",
    ]


CHECK_FAILED = "scalerun: the check failed"
"""What the job script prints when its first step, the in-job check, failed; the launcher
that follows the job finds it in the log and says why in one line."""
CHECK_ARGS = ("--quick", "--timeout=60")
"""What the job's first step runs on every rank: the short doctor (see doctor.options)."""


CHECK_PROGRAM = (
    "import sys\n"
    "try:\n"
    "    from scalerun.commands.rank_doctor import main\n"
    "except ImportError as error:\n"
    "    print(f'FAIL  scalerun: this python cannot import scalerun ({error}): the check cannot run; '\n"
    "          'let scalerun bring itself into the image (the default), or pass --no-check', flush=True)\n"
    "    sys.exit(1)\n"
    "sys.exit(main(sys.argv[1:]))"
)
"""The check as the job's python runs it. It is never skipped: where that python cannot
import scalerun, the check FAILs with the fix and the job ends before training."""


def _check_step(job: SlurmJob) -> list[str]:
    """The doctor's short check as the job's first step, started exactly like the training
    (same srun options, binding, container and mode) so that it sees what training will;
    a FAIL (non-zero exit) ends the job here. It runs unprofiled and unsampled, and is
    never skipped (:data:`CHECK_PROGRAM`)."""
    if not job.check:
        return []
    # no --site: the check resolves the launch's site as the ranks do (frozen in the run directory)
    check = replace(job, script=job.python, entry="executable", bind_workers=False,
                    prefix_lines=False,  # its FAIL lines are read from the log as printed
                    script_args=("-c", CHECK_PROGRAM, *CHECK_ARGS))
    rendered = [" ".join(shell_quote(word) for word in group) for group in srun_groups(check)]
    return [
        "# --- check every rank first (scalerun doctor --quick); a FAIL ends the job here ---",
        "check=0",
        "(",
        f"    unset {variables.PROFILE_RANKS} {variables.PROFILER}",
        f"    export {variables.MONITOR}=0",
        "    " + " \\\n        ".join(rendered),
        ") || check=$?",
        f'if (( check )); then echo "{CHECK_FAILED} (exit code $check): see its FAIL lines above" >&2; exit "$check"; fi',
        "",
    ]
