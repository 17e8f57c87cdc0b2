"""--engine ray on a real two-node cluster (tests/ray_cluster.py): the same bytes as the local engine, tasks
on both nodes, the driver's memory bounded.

The cluster is started once for this module (about 20 s) with one CPU per node, so that once the head's CPU
is busy Ray sends tasks to the worker node; each command runs as `python -m batchtool ... --ray-address HEAD:PORT` in a
child process, as a user would run it. The nodes' workers import batchtool from this source tree
(PYTHONPATH in the environment the nodes start with).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import suppress

import numpy as np
import pyarrow as pa
import pytest

from conftest import data_bytes, write_parquet_shards
from batchtool.core.synthetic import make_table
from memlimit import batchtool
from ray_cluster import HEAD_IP, WORKER_IP, Cluster, Node, start_cluster
from test_ray import COMMANDS, PIPELINE

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one Ray runtime at a time (conftest)

DRIVER_LIMIT = 1 << 30
"""The driver's RSS cap: a Ray driver (the core worker, pyarrow, batchtool) peaks at 170-250 MB here."""
MULTINODE = {name: COMMANDS[name] for name in ("segment", "stratify-balanced")}
MULTINODE["shuffle"] = ("shuffle", "--memory", "256KB", "--batch-size", "32")
"""One command of each kind of plan on two nodes: a stream (segment's lanes) and two exchanges (a sort, and quotas
cut from sorted groups); every command's bytes on Ray are test_ray.py's, on one node."""
EXCHANGED = {"shuffle": 2048, "stratify-balanced": 4096}
"""Commands that run as map-reduce on the workers, and the most bytes a task may move through the driver (their
plans, paths and counts; bucket's and stratify's plans carry their first pass's histograms)."""
TASKS_BY_NODE: dict[str, int] = {}
"""Tasks per node over every run of this module: Ray's scheduler decides per task, so the evidence that
both nodes worked is the sum (a short pass may run on the head's CPU alone)."""


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """2,000 rows in 10 row groups: tasks long enough (tens of ms) that Ray's scheduler, which keeps short
    tasks on the driver's node while it has a free CPU, sends some to the worker node."""
    table = make_table(2000, seed=7)
    table = table.append_column("keep", pa.array(np.arange(2000) % 5 != 0))
    return write_parquet_shards(str(tmp_path_factory.mktemp("src")), table, row_group_size=200)


@pytest.fixture(scope="module")
def cluster():
    """Head 127.0.0.2 and worker 127.0.0.3, one CPU each, token auth with a token of their own; stopped by PID."""
    pytest.importorskip("ray")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(tests), tests, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="rc") as temp:  # short: Ray's socket paths must fit 107 bytes
        try:
            running = start_cluster(temp, env)
        except RuntimeError as exc:
            pytest.skip(f"no two-node Ray cluster here: {exc}")
        try:
            yield running
        finally:
            running.stop()


def both_engines(cluster, run_cli, tmp_path, args: tuple[str, ...]) -> dict:
    """Run args (`{dst}`: the output, `{tmp}`: tmp_path) on the local engine in this process and on the cluster
    in a child process (killed above DRIVER_LIMIT); check the bytes and statistics are the same; the cluster
    run's manifest `run`, with the driver's peak RSS."""
    manifests = {}
    for engine in ("local", "ray"):
        dst = tmp_path / engine
        command = [str(a).format(dst=dst, tmp=tmp_path) for a in args]
        if engine == "local":
            done = run_cli(*command, "-q")
            assert done.exit_code == 0, done.stderr
        else:
            done = batchtool(*command, "-q", "--engine", "ray", "--ray-address", cluster.address,
                             limit_bytes=DRIVER_LIMIT, env=cluster.env)
            assert done.returncode == 0, done.stderr
        manifests[engine] = json.loads((dst / ".batchtool_manifest.json").read_text())
    assert data_bytes(str(tmp_path / "ray")) == data_bytes(str(tmp_path / "local"))
    assert manifests["ray"]["stats"] == manifests["local"]["stats"]
    return {**manifests["ray"]["run"], "driver_peak_bytes": done.peak_bytes}  # VmHWM (see memlimit.py)


def ran_on_the_cluster(run: dict) -> None:
    """Every task ran on one of the two nodes; counted in TASKS_BY_NODE."""
    assert run["engine"] == "ray"
    by_node = run["ray"]["tasks_by_node"]
    assert set(by_node) <= {HEAD_IP, WORKER_IP}, by_node
    assert sum(by_node.values()) + run["ray"]["tasks_cancelled"] == run["ray"]["tasks"] > 0, run["ray"]
    for node, tasks in by_node.items():
        TASKS_BY_NODE[node] = TASKS_BY_NODE.get(node, 0) + tasks


@pytest.mark.parametrize("name", MULTINODE)
def test_same_output_as_local_on_the_cluster(name, cluster, src, tmp_path, run_cli, record_property):
    command, *options = MULTINODE[name]
    run = both_engines(cluster, run_cli, tmp_path, (command, src, "{dst}", *options))
    ran_on_the_cluster(run)
    if name in EXCHANGED:  # map-reduce on the workers: only plans, paths and counts cross the driver
        moved = run["ray"]["bytes_sent"] + run["ray"]["bytes_received"]
        assert moved / run["ray"]["items"] < EXCHANGED[name], run["ray"]
    record_property("driver_peak_bytes", run["driver_peak_bytes"])


def test_pipeline_run(cluster, src, tmp_path, run_cli, record_property):
    for engine in ("local", "ray"):
        (tmp_path / f"{engine}.toml").write_text(PIPELINE.format(src=src, dst=tmp_path / engine))
    run = both_engines(cluster, run_cli, tmp_path, ("run", "{tmp}/{dst.name}.toml"))
    ran_on_the_cluster(run)
    record_property("driver_peak_bytes", run["driver_peak_bytes"])


def test_tasks_ran_on_both_nodes():
    """After the runs above (pytest runs this module's tests in file order)."""
    if not TASKS_BY_NODE:
        pytest.skip("needs the runs above")
    # how many land on each is Ray's choice per task (on a quiet machine the head's CPU takes most: 122 and 4
    # were seen): that both nodes ran some is the evidence, not a share
    assert set(TASKS_BY_NODE) == {HEAD_IP, WORKER_IP} and min(TASKS_BY_NODE.values()) >= 1, TASKS_BY_NODE


KEEPS_HANDLERS = """
import os, signal, sys
from batchtool.exec.engines.ray import RayEngine
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
RayEngine(address=sys.argv[1]).cpus  # connects: ray.init
os.kill(os.getpid(), signal.SIGTERM)
while not got:  # the handler runs in the main thread between bytecodes; Ray's own would have ended the process
    pass
print("kept")
"""


def test_connecting_keeps_the_programs_signal_handlers(cluster):
    """ray.init installs Ray's SIGTERM handler in the driver (a stack dump, then an exit that leaves every
    temporary file behind); the engine puts the program's back, so batchtool's own clean exit (one line, 143,
    nothing left) still answers SIGTERM on Ray."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KEEPS_HANDLERS, cluster.address], env=cluster.env,
                          capture_output=True, text=True, timeout=COMMAND_SECONDS)  # a hang guard only
    assert done.returncode == 0 and done.stdout.strip() == "kept", (done.returncode, done.stdout, done.stderr[-2000:])


# -- when Ray loses what it runs on (last: the node tests end the cluster) ------------------------------------------

LOOK_SECONDS = 0.01
"""How often a test that takes a cluster's processes away looks for them, and for the command's end."""
COMMAND_SECONDS = 300.0


def run_losing(cluster: Cluster, tmp_path, args: Sequence[object], take_away: Callable[[], bool]) -> \
        subprocess.CompletedProcess:
    """`batchtool ARGS` on the cluster in a child process (its temporary files in tmp_path/tmp), while
    `take_away()` kills what Ray runs on: called until it says it is done, or the command ends."""
    (tmp_path / "tmp").mkdir()
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        child = subprocess.Popen([sys.executable, "-m", "batchtool", *map(str, args), "-q", "--engine", "ray",
                                  "--ray-address", cluster.address], stdout=stdout, stderr=stderr,
                                 env={**cluster.env, "TMPDIR": str(tmp_path / "tmp")})
        done = False
        while not done and child.poll() is None:
            done = take_away()
            with suppress(subprocess.TimeoutExpired):
                child.wait(LOOK_SECONDS)
        child.wait(COMMAND_SECONDS)
    return subprocess.CompletedProcess(child.args, child.returncode, out.read_text(), err.read_text())


def kill(pids: list[int]) -> list[int]:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def ended_in_one_line(done: subprocess.CompletedProcess, tmp_path, line: str) -> None:
    """Exit 2, `line` (a pattern) alone on stderr, nothing on stdout, and nothing left: no DST in tmp_path/out,
    no temporary file beside it or in the command's temp dir."""
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout, done.stderr)
    assert re.fullmatch(line + "\n", done.stderr), done.stderr
    assert os.listdir(tmp_path / "out") == [] and os.listdir(tmp_path / "tmp") == []


def test_a_task_whose_worker_always_dies_ends_in_one_line(cluster, src, tmp_path):
    """Every worker process that runs a task is killed: Ray runs each task 4 times, then gives up; the command says
    which task and where in one line (exit 2), and leaves nothing."""
    killed: list[int] = []

    def kill_every_task() -> bool:
        killed.extend(kill([pid for node in cluster.nodes for pid in node.pids("ray::_run_group")]))
        return False

    (tmp_path / "out").mkdir()
    done = run_losing(cluster, tmp_path, ("convert", src, tmp_path / "out" / "dst"), kill_every_task)
    ended_in_one_line(done, tmp_path, r"error: --engine ray: Ray gave up on the task reading "
                      r"\S+/part-0000[01]\.parquet: its worker process died in each of 4 attempts"
                      r"( \(lost on [0-9., ]+\))?")
    assert len(killed) >= 4


@pytest.mark.parametrize("lost", ["worker", "head"])  # in this order: losing the head ends the cluster
def test_a_node_lost_mid_run(lost, cluster, tmp_path, run_cli):
    """The raylet of a node is killed (SIGKILL) as soon as a task of the command runs there (40 row groups: enough
    map tasks that some reach the worker node). The worker node: Ray runs its tasks again on the head, and the
    command writes the local engine's bytes (or, had Ray given up, one line). The head, where the command runs: one
    line naming it, exit 2, nothing left. stdout stays empty either way (Ray's driver would print a dead raylet's
    log there)."""
    node: Node = cluster.nodes[0 if lost == "head" else 1]
    src = write_parquet_shards(str(tmp_path / "src"), make_table(8000, seed=8), row_group_size=200)
    args = ("shuffle", src, tmp_path / "out" / "dst", "--memory", "256KB", "--batch-size", "32")

    def kill_its_raylet_once_it_works() -> bool:
        return bool(node.pids("ray::_run_group") and kill(node.pids("raylet")))

    (tmp_path / "out").mkdir()
    assert run_cli(*args[:2], tmp_path / "local", *args[3:], "-q").exit_code == 0
    done = run_losing(cluster, tmp_path, args, kill_its_raylet_once_it_works)
    assert not node.pids("raylet"), "the command ended before a task of it ran on the node"
    if lost == "head":
        ended_in_one_line(done, tmp_path, rf"error: --engine ray: the raylet of the Ray node this command runs on "
                          rf"\({re.escape(HEAD_IP)}\) died while the task .* ran; the command cannot reach the "
                          r"cluster without it")
    elif done.returncode == 2:
        ended_in_one_line(done, tmp_path, r"error: --engine ray: Ray gave up on the task [^\n]*")
    else:
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
        assert data_bytes(str(tmp_path / "out" / "dst")) == data_bytes(str(tmp_path / "local"))
        assert os.listdir(tmp_path / "out") == ["dst"] and os.listdir(tmp_path / "tmp") == []
