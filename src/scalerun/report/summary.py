"""The three lines the launcher prints when a run ends, and the words they share with
the report: throughput and step split; GPUs; the worst verdict.

Why it must never raise: it runs after the user's job, whatever state the job left
(killed halfway, no step log because the script crashed at import, an unwritable file
system). A summary that fails would hide the job's own exit status, so every failure
becomes a line that says what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from scalerun.errors import ScalerunError
from scalerun.report.build import build_report
from scalerun.report.load import load_run
from scalerun.report.model import Report
from scalerun.report.steps import MIXED, WARMUP_STEPS, RunSteps
from scalerun.report.verdicts import NEVER_FORMED, gib, pct, seconds
from scalerun.rundir import MONITOR, STEPS
from scalerun.runtime import steplog_reader as keys


def summary_lines(run_dir: Path | str, warmup_steps: int = WARMUP_STEPS,
                  ended: str | None = None) -> list[str]:
    """Exactly three short lines about the run in ``run_dir``; never raises.

    ``ended``: how the run ended when it ended badly (a hang, a failed rank, a
    preemption, as the launcher tells it); it is then the verdict, before anything the
    report found, since a summary that says "no problem found" above "error: hang" is wrong.
    """
    try:
        return report_summary(build_report(load_run(Path(run_dir)), warmup_steps), ended)
    except ScalerunError as error:
        return [f"throughput: nothing recorded ({error})", "GPUs: nothing recorded",
                f"verdict: {ended}" if ended else "verdict: nothing to judge"]
    except Exception as error:  # noqa: BLE001 - the job's own outcome must not be hidden
        return [f"throughput: the report failed ({type(error).__name__}: {error})",
                "GPUs: unknown", f"verdict: {ended}" if ended else
                f"verdict: unknown; try `scalerun report {run_dir}`"]


def report_summary(report: Report, ended: str | None = None) -> list[str]:
    """The three lines of a built report."""
    return [steps_line(report), gpus_line(report), verdict_line(report, ended)]


def steps_line(report: Report) -> str:
    steps = report.steps
    if steps is None:
        return f"throughput: no step recorded in {report.run_dir / STEPS}"
    rate = f"{number(steps.samples_per_s)} samples/s" if steps.samples_per_s else "samples not counted"
    if any(v.topic == "one-world" and NEVER_FORMED in v.message for v in report.verdicts):  # copies of one run
        each = (f"{number(steps.samples_per_s / steps.world_size)} samples/s each" if steps.samples_per_s
                else "samples not counted")
        return (f"throughput: {each}, {steps.world_size} ranks each running the whole job alone (no one "
                f"world: see the verdict); step {seconds(steps.step_s)}")
    return f"throughput: {rate} on {steps.world_size} rank(s); {split(steps, report.not_measured)}"


def compute_part(steps: RunSteps) -> str:
    """``compute 70 %``, or ``compute + comm 92 % (not separable)`` where no rank measured
    its communication."""
    share = pct(steps.share(steps.compute_s) or 0.0)
    return f"compute {share}" if steps.comm_s is not None else f"{MIXED} {share} (not separable)"


def split(steps: RunSteps, not_measured: Mapping[str, str] | None = None) -> str:
    """``step 215 ms: data 4 %, compute 70 %, comm 21 %, other 5 %``; for a loop scalerun
    does not own, ``step 14 ms: compute + comm 92 % (not separable), other 8 %; data wait,
    comm: not measured (loop not owned by scalerun)`` (its data wait is inside other)."""
    if not_measured:
        return unowned_split(steps, not_measured)
    comm = pct(steps.share(steps.comm_s) or 0.0) if steps.comm_s is not None else "not measured"
    data = pct(steps.share(steps.data_s) or 0.0) if steps.data_s is not None else "not measured"
    return (f"step {seconds(steps.step_s)}: data {data}, "
            f"{compute_part(steps)}, comm {comm}, "
            f"other {pct(steps.share(steps.other_s) or 0.0)}")


UNMEASURED_NAMES = {keys.DATA_S: "data wait", keys.COMM_S: "comm", keys.FWD_S: "forward",
                    keys.BWD_S: "backward"}


def unowned_split(steps: RunSteps, not_measured: Mapping[str, str]) -> str:
    """The split of a loop seen through torch's hooks: only what they measured, then what
    they could not."""
    parts = []
    if keys.DATA_S not in not_measured:
        parts.append(f"data {pct(steps.share(steps.data_s) or 0.0)}")
    parts.append(compute_part(steps))
    if steps.comm_s is not None:
        parts.append(f"comm {pct(steps.share(steps.comm_s) or 0.0)}")
    parts.append(f"other {pct(steps.share(steps.other_s) or 0.0)}")
    missing = [UNMEASURED_NAMES.get(key, key) for key in not_measured]
    return (f"step {seconds(steps.step_s)}: {', '.join(parts)}; {', '.join(missing)}: "
            "not measured (loop not owned by scalerun)")


def gpus_line(report: Report) -> str:
    gpus = report.gpus
    if gpus is None and not report.nodes:
        return f"GPUs: no monitor file in {report.run_dir / MONITOR}"
    if gpus is None:
        cpus = [n.cpu_mean_pct for n in report.nodes if n.cpu_mean_pct is not None]
        busy = f"; node CPUs {pct(sum(cpus) / len(cpus) / 100)} busy" if cpus else ""
        return f"GPUs: no GPU on {len(report.nodes)} node(s){busy}"
    parts = [f"{gpus.gpus} on {gpus.nodes} node(s)"]
    if gpus.util_mean_pct is not None and gpus.util_median_pct is not None:
        parts.append(f"busy {pct(gpus.util_mean_pct / 100)} (median {pct(gpus.util_median_pct / 100)})")
    if gpus.idle_fraction is not None:
        parts.append(f"idle {pct(gpus.idle_fraction)}")
    if gpus.mem_peak_mb is not None:
        parts.append(f"peak memory {gib(gpus.mem_peak_mb)}")
    parts.append(f"energy {energy(gpus.energy_wh)}" if gpus.energy_wh is not None else "no power reading")
    return "GPUs: " + ", ".join(parts)


def number(value: float) -> str:
    """1765.5 -> ``1766``, 40960.2 -> ``40960``, 3.14159 -> ``3.14``: no exponents."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def energy(wh: float) -> str:
    return f"{wh:.3g} Wh" if wh < 1000 else f"{wh / 1000:.3g} kWh"


def verdict_line(report: Report, ended: str | None = None) -> str:
    """The worst verdict; how the run ended comes first when it ended badly."""
    if ended:  # the preemption's own verdict (from its event) is the line already
        more = len([v for v in report.verdicts if not ended.startswith(f"{v.topic}:")])
        tail = f" (+{more} more: scalerun report {report.run_dir})" if more else ""
        return f"verdict: {ended}{tail}"
    if not report.verdicts:
        judged = report.steps is not None or report.nodes
        return "verdict: no problem found" if judged else "verdict: nothing to judge"
    more = len(report.verdicts) - 1
    tail = f" (+{more} more: scalerun report {report.run_dir})" if more else ""
    return f"verdict: {report.verdicts[0].message}{tail}"
