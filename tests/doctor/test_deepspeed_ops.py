"""DeepSpeed's ops in the doctor: which ops a config needs, and the verdicts on fact tables.

The rule and the check are pure, so a LUMI job whose nodes lack a prebuilt FusedAdam is
written as data; one test reads the real table of the DeepSpeed installed here, and one
runs the real ``scalerun doctor`` with a config named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scalerun.doctor.checks import FAIL, PASS, SKIP, WARN, check_deepspeed_ops, run_checks
from scalerun.doctor.deepspeed_ops import DeepSpeedFacts, OpState, ops_needed, read_deepspeed
from scalerun.doctor.facts import facts_from_dict
from scalerun.doctor.report import fact_json
from tests.doctor.factsets import lumi_job

REPO = Path(__file__).resolve().parents[2]
ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}


def offload(device: str, **more) -> dict:
    return {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": device}}, **more}


@pytest.mark.parametrize(("config", "accelerator", "needs"), [
    ({}, "cuda", ()),
    (ADAM, "cuda", ("fused_adam",)),
    ({"optimizer": {"type": "AdamW"}}, "cuda", ("fused_adam",)),
    ({"optimizer": {"type": "adam", "params": {"torch_adam": True}}}, "cuda", ()),
    (offload("cpu", **ADAM), "cuda", ("cpu_adam",)),
    (offload("nvme", **ADAM), "cuda", ("cpu_adam", "async_io")),
    ({"optimizer": {"type": "Lamb"}}, "cuda", ("fused_lamb",)),
    ({"optimizer": {"type": "Lion"}}, "cuda", ("fused_lion",)),
    (offload("cpu", optimizer={"type": "Lion"}), "cuda", ("cpu_lion",)),
    (offload("cpu", optimizer={"type": "Adagrad"}), "cuda", ("cpu_adagrad",)),
    ({"optimizer": {"type": "Adagrad"}}, "cuda", ()),
    ({"optimizer": {"type": "SGD"}}, "cuda", ()),
    ({"zero_optimization": {"offload_param": {"device": "nvme"}}}, "cuda", ("async_io",)),
    ({"zero_optimization": {"offload_optimizer": {"device": "none"}}, **ADAM}, "cuda", ("fused_adam",)),
    ({}, "cpu", ("deepspeed_shm_comm",)),
    (ADAM, "cpu", ("fused_adam", "deepspeed_shm_comm")),
])
def test_ops_a_config_needs(config, accelerator, needs) -> None:
    assert ops_needed(config, accelerator) == needs


# A LUMI-G node as ds_report shows it in the course (seed: the "Extreme scale AI" slides):
# fused_adam, fused_lamb, fused_lion prebuilt; cpu_adam JIT-compilable; async_io not.
COURSE_OPS = (
    OpState(name="async_io", prebuilt=False, compatible=False, builder="AsyncIOBuilder", build_var="DS_BUILD_AIO"),
    OpState(name="cpu_adam", prebuilt=False, compatible=True, builder="CPUAdamBuilder",
            build_var="DS_BUILD_CPU_ADAM"),
    OpState(name="fused_adam", prebuilt=True, compatible=True, builder="FusedAdamBuilder",
            build_var="DS_BUILD_FUSED_ADAM"),
    OpState(name="fused_lamb", prebuilt=True, compatible=True, builder="FusedLambBuilder",
            build_var="DS_BUILD_FUSED_LAMB"),
)


def ds(needs=(), ops=COURSE_OPS, **more) -> DeepSpeedFacts:
    return DeepSpeedFacts(version="0.14.0", accelerator="cuda", ninja=True, extensions_dir="/tmp/ext",
                          ops=ops, config="/project/ds_config.json" if needs else None, needs=needs, **more)


def job(per_node) -> list:
    """The healthy 2-node LUMI job, with ``per_node(node)`` as DeepSpeed facts of each node's
    local rank 0 (where the doctor reads them)."""
    return [replace(f, deepspeed=per_node(f.node_rank)) if f.local_rank == 0 else f for f in lumi_job()]


def with_op(name: str, **fields) -> tuple[OpState, ...]:
    return tuple(replace(op, **fields) if op.name == name else op for op in COURSE_OPS)


def levels(verdicts) -> list[tuple[str, str]]:
    return [(v.level, v.message) for v in verdicts]


def test_without_deepspeed_one_skip_line() -> None:
    assert levels(check_deepspeed_ops(lumi_job())) == [(SKIP, "DeepSpeed is not installed: no op to check")]


def test_the_table_is_one_verdict_with_ds_report_grouped() -> None:
    (table,) = check_deepspeed_ops(job(lambda node: ds()))
    assert table.level == PASS
    assert table.message == "DeepSpeed 0.14.0 (cuda): 2 op(s) prebuilt, 1 built on first use, 1 not compatible"
    assert table.details == ("prebuilt: fused_adam, fused_lamb",
                             "built on first use (JIT, into /tmp/ext): cpu_adam",
                             "not compatible here: async_io", "ninja for JIT builds: yes")


@pytest.mark.parametrize(("per_node", "expected"), [
    # the course's prebuilt FusedAdam: nothing is compiled
    (lambda node: ds(needs=("fused_adam",)), []),
    # ZeRO-Offload's CPUAdam is not prebuilt: every node compiles it at start
    (lambda node: ds(needs=("cpu_adam",)), [(WARN, "cpu_adam would be JIT-compiled on 2 node(s)")]),
    # already built into node 0's extensions folder: only node 1 compiles
    (lambda node: ds(needs=("cpu_adam",), ops=with_op("cpu_adam", cached=node == 0)),
     [(WARN, "cpu_adam would be JIT-compiled on 1 node(s)")]),
    (lambda node: ds(needs=("cpu_adam",), ops=with_op("cpu_adam", cached=True)), []),
    # NVMe offload needs async_io, which ds_report says cannot be built (no libaio)
    (lambda node: ds(needs=("async_io",)), [(FAIL, "the DeepSpeed config needs async_io, which cannot be built")]),
    # a JIT build without ninja fails (node 0); node 1 has ninja and compiles at start
    (lambda node: replace(ds(needs=("cpu_adam",)), ninja=node == 1),
     [(FAIL, "the DeepSpeed config needs cpu_adam, which cannot be built on 1 node(s)"),
      (WARN, "cpu_adam would be JIT-compiled on 1 node(s)")]),
    # Lion has no builder on this accelerator's table
    (lambda node: ds(needs=("fused_lion",)), [(FAIL, "the DeepSpeed config needs fused_lion, which cannot be built")]),
    (lambda node: ds(error="DeepSpeed config /x.json cannot be parsed"),
     [(WARN, "the run's DeepSpeed config cannot be read")]),
    (lambda node: replace(ds(), version="0.14.0" if node == 0 else "0.15.1"),
     [(WARN, "DeepSpeed's version or prebuilt ops differ between nodes")]),
])
def test_needed_ops_verdicts(per_node, expected) -> None:
    verdicts = check_deepspeed_ops(job(per_node))
    found = [(v.level, v.message) for v in verdicts if v.level != PASS]
    assert len(found) == len(expected), found
    for (level, message), (want_level, want_start) in zip(found, expected, strict=True):
        assert level == want_level and message.startswith(want_start), (level, message)


def test_a_warning_names_the_nodes_and_the_build_command() -> None:
    verdicts = check_deepspeed_ops(job(lambda node: ds(needs=("cpu_adam",))))
    (warn,) = [v for v in verdicts if v.level == WARN]
    assert warn.nodes == ("nid005001", "nid005002")
    assert "DS_BUILD_CPU_ADAM=1 pip install deepspeed" in warn.fix
    assert "create_op_builder('CPUAdamBuilder').load()" in warn.fix
    assert warn.details == ("nid005001: not prebuilt, not in /tmp/ext", "nid005002: not prebuilt, not in /tmp/ext")


def test_the_check_runs_with_the_others_and_round_trips_through_json() -> None:
    facts = job(lambda node: ds(needs=("cpu_adam",)))
    assert any(v.check == "deepspeed-ops" and v.level == WARN for v in run_checks(facts))
    again = [facts_from_dict(json.loads(json.dumps(fact_json(f)))) for f in facts]
    assert again == facts


def test_the_installed_deepspeed_table(tmp_path, monkeypatch) -> None:
    """This machine's DeepSpeed (CPU accelerator) through its own API, with a config."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'scalerun[deepspeed]')")
    config = tmp_path / "ds_config.json"
    config.write_text('{"optimizer": {"type": "Adam",}, "zero_optimization": {"stage": 2},}')
    found = read_deepspeed({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
                            "SCALERUN_DEEPSPEED_CONFIG": str(config)})
    assert found is not None and found.accelerator == "cpu" and found.extensions_dir == str(tmp_path / "ext")
    assert {"fused_adam", "cpu_adam", "deepspeed_shm_comm"} <= {op.name for op in found.ops}
    assert found.needs == ("fused_adam", "deepspeed_shm_comm") and found.error is None
    assert not any(op.cached for op in found.ops)  # an empty extensions folder holds no build
    assert found.op("fused_adam").build_var == "DS_BUILD_FUSED_ADAM"


def test_the_quick_check_reads_deepspeed_only_for_a_launch_with_a_config(tmp_path) -> None:
    """A job's first step (``--quick``) leaves an installed DeepSpeed unimported unless the
    launch names a DeepSpeed config: the import is 1.5 s of CPU per node in every job. The
    verdict says SKIP, not PASS."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'scalerun[deepspeed]')")
    unread = read_deepspeed({"TORCH_EXTENSIONS_DIR": str(tmp_path)}, quick=True)
    assert unread is not None and unread.unread and not unread.ops
    assert levels(check_deepspeed_ops(job(lambda node: unread))) == [
        (SKIP, "not read by the quick check of a launch without --deepspeed-config: "
               "`scalerun doctor` shows DeepSpeed's ops")]
    config = tmp_path / "ds_config.json"
    config.write_text('{"optimizer": {"type": "Adam"}}')
    read = read_deepspeed({"TORCH_EXTENSIONS_DIR": str(tmp_path), "SCALERUN_DEEPSPEED_CONFIG": str(config)},
                          quick=True)
    assert read is not None and not read.unread and read.needs == ("fused_adam", "deepspeed_shm_comm")


def test_doctor_reports_the_ops_of_the_launched_config(tmp_path) -> None:
    """The real doctor on one rank, with an empty extensions folder: the config needs
    FusedAdam, and DeepSpeed's CPU comm needs its shared-memory op, built nowhere: WARNs."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'scalerun[deepspeed]')")
    config = tmp_path / "ds_config.json"
    config.write_text('{"optimizer": {"type": "Adam"}}')
    env = {**os.environ, "SCALERUN_DEEPSPEED_CONFIG": str(config), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    done = subprocess.run([sys.executable, "-m", "scalerun", "doctor", "--json", "--no-bandwidth"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)
    report = json.loads(done.stdout)
    ours = [v for v in report["verdicts"] if v["check"] == "deepspeed-ops"]
    assert [v["level"] for v in ours] == [PASS, WARN, WARN], ours
    assert ours[1]["message"].startswith("fused_adam would be JIT-compiled on 1 node(s)")
    assert ours[2]["message"].startswith("deepspeed_shm_comm would be JIT-compiled on 1 node(s)")
    assert report["ranks"][0]["deepspeed"]["needs"] == ["fused_adam", "deepspeed_shm_comm"]
