"""The one-node rendezvous: its store on 127.0.0.1 only, chosen only where no restart needs c10d."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from torch.distributed import TCPStore
from torch.distributed import run as torchrun
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

from scalerun.launch.local import rendezvous
from scalerun.launch.local.agent import choose_rendezvous
from tests.launch.requests import local_job


def chosen(tmp_path: Path, **request: object) -> tuple[str, str, bool]:
    script = tmp_path / "t.py"
    script.write_text("import scalerun\n")
    args = torchrun.parse_args(list(local_job(script=str(script), **request).argv))
    choose_rendezvous(args)
    return args.rdzv_backend, args.rdzv_endpoint, args.standalone


def test_one_node_without_restarts_uses_the_loopback_store(tmp_path: Path) -> None:
    assert chosen(tmp_path, nproc_per_node=2) == ("scalerun-local", "127.0.0.1:0", False)


def test_restarts_keep_torchs_c10d_rendezvous(tmp_path: Path) -> None:
    assert chosen(tmp_path, nproc_per_node=2, max_restarts=1) == ("c10d", "localhost:0", True)


def test_several_nodes_keep_the_rendezvous_they_ask_for(tmp_path: Path) -> None:
    backend, endpoint, _ = chosen(tmp_path, nproc_per_node=2, nnodes=2, node_rank=0,
                                  master_addr="n1", master_port=29400)
    assert (backend, endpoint) == ("static", "")


def listening_addresses(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_store_listens_on_loopback_only_and_serves_the_ranks() -> None:
    rendezvous.register()
    params = RendezvousParameters(backend=rendezvous.BACKEND, endpoint="127.0.0.1:0",
                                  run_id="job-1", min_nodes=1, max_nodes=1)
    handler = rendezvous_handler_registry.create_handler(params)
    assert handler.use_agent_store
    info = handler.next_rendezvous()
    address, port = info.bootstrap_store_info.master_addr, info.bootstrap_store_info.master_port
    assert (address, info.rank, info.world_size) == ("127.0.0.1", 0, 1)
    assert listening_addresses(port) == {"127.0.0.1"}
    # a rank connects as a client, under the same prefix the agent passes on
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    client.set("job-1/hello", "rank")
    assert info.store.get("hello") == b"rank"
    # the machine's other addresses do not answer
    outside = socket.gethostbyname(socket.gethostname())
    if not outside.startswith("127."):
        with pytest.raises(OSError):
            socket.create_connection((outside, port), timeout=2).close()
    again = handler.next_rendezvous()  # the agent asks again on a restart of its workers
    assert again.bootstrap_store_info.master_port == port


@pytest.mark.parametrize(("agent", "agent_store"), [("", "False"), ("torch", "True")])
def test_ranks_meet_on_the_loopback_address(tmp_path: Path, agent: str, agent_store: str) -> None:
    """Without torch elastic's agent (one node, no restarts) rank 0 hosts the store of a
    plain ``init_process_group`` script, and it listens on the loopback address only, as
    the agent's does (the rank's boot hook binds it); ``SCALERUN_LOCAL_AGENT=torch`` keeps
    the agent's store."""
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import os, psutil, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(t)
        port = int(os.environ["MASTER_PORT"])
        listening = sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp")
                            if c.status == psutil.CONN_LISTEN and c.laddr.port == port})
        print("rdzv", os.environ["MASTER_ADDR"], os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
              int(t), "store on", ",".join(listening) or "-", flush=True)
        dist.destroy_process_group()
    """))
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2",
                           "--no-monitor", str(script)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SCALERUN_LOCAL_AGENT": agent})
    assert done.returncode == 0, done.stderr
    hosted_by_rank0 = "127.0.0.1" if agent_store == "False" else "-"
    assert f"[rank0]: rdzv 127.0.0.1 {agent_store} 3 store on {hosted_by_rank0}" in done.stdout
    assert f"[rank1]: rdzv 127.0.0.1 {agent_store} 3 store on -" in done.stdout
