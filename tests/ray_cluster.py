"""A real two-node Ray cluster on one host (head 127.0.0.2, worker 127.0.0.3), started and stopped by PID.

Two `ray start` nodes on one host need distinct addresses; Linux routes all of 127/8 to the loopback
device, so each node gets its own loopback address, temp dir and free ports. Each node is one
`ray start --block` process in its own session: stopping it (SIGTERM, then SIGKILL to its process
group) ends that node's Ray processes and nothing else — not `ray stop`, which would end every Ray
process on the machine, including the local cluster tests/engines/test_ray.py starts in the same run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from memlimit import HANG_GUARD

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
START_SECONDS = HANG_GUARD
"""Longest wait for both nodes to be alive: a hang guard (two Ray nodes start in 10-30 s on a busy 2-core machine,
and the guard does not depend on how loaded it is)."""
STOP_SECONDS = 20.0
"""A node's graceful stop, before its group is killed anyway (no test fails on it)."""
POLL_SECONDS = HANG_GUARD / 4
"""Longest one look at the cluster takes (connecting to a GCS that is still starting can hang; a look that times out
counts no node alive and the next one starts), generous so that a slow look on a loaded machine still counts."""
NODE_PORT_OPTIONS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                     "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
NODE_LOSS_SECONDS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "3000",
                     "RAY_health_check_failure_threshold": "3"}
"""The GCS's health checks of the nodes: a node that misses 3 in a row (1 s apart, 3 s each) is dead, a few seconds
after its raylet is (Ray's defaults, 5 of 3 s and 10 s, take 15-20 s before Ray runs the node's tasks again)."""
EPHEMERAL_MARGIN = 10000
"""Ports are chosen from here up to the start of the ephemeral range."""
WORKER_PORTS = 64
"""Ports for a node's worker processes. Every driver that connects takes one too, and the raylet does not
give them back at once: a module of a dozen commands needs a few dozen."""


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free right now, below the kernel's ephemeral range.

    Below it, no port Ray's own processes bind to port 0 (or this test run's other sockets) can take one
    of them between this choice and the node binding it. Each is checked by binding it.
    """
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    candidates = random.Random().sample(range(EPHEMERAL_MARGIN, ephemeral), ephemeral - EPHEMERAL_MARGIN)
    ports = []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} free ports below {ephemeral}")


def loopback_works(ip: str) -> str | None:
    """None if a socket can listen on `ip` and be reached there, else why not."""
    try:
        with socket.socket() as server:
            server.bind((ip, 0))
            server.listen(1)
            socket.create_connection(server.getsockname(), timeout=HANG_GUARD).close()  # a hang guard only
    except OSError as exc:
        return f"{ip}: {exc.strerror or exc}"
    return None


def _port_options(ports: list[int], *, head: bool) -> list[str]:
    """Every port `ray start` listens on, taken from `ports` (free ones, chosen for both nodes at once so the
    worker's cannot repeat one the head has not bound yet): Ray's defaults would collide with another cluster."""
    names = list(NODE_PORT_OPTIONS)
    if head:
        names.append("--port")  # no --ray-client-server-port: Ray Client (ray[client]) is not started
    ports = [ports.pop() for _ in range(len(names) + WORKER_PORTS)]
    options = [f"{name}={port}" for name, port in zip(names, ports)]
    return options + ["--worker-port-list=" + ",".join(map(str, ports[len(names):]))]


@dataclass
class Node:
    """One `ray start --block` process (and, in its process group, the Ray processes it started)."""

    ip: str
    process: subprocess.Popen
    log: str

    def pids(self, name: str) -> list[int]:
        """This node's processes (its session: the node's Ray processes and their workers) whose program is `name`:
        `raylet`, or `ray::FUNCTION`, the title of a worker process while it runs a task of FUNCTION."""
        found = []
        for entry in os.scandir("/proc"):
            try:
                if not entry.name.isdigit() or os.getsid(int(entry.name)) != self.process.pid:
                    continue
                with open(os.path.join(entry.path, "cmdline"), "rb") as f:
                    program = f.read().split(b"\0")[0].decode(errors="replace").strip()
            except OSError:  # ended meanwhile
                continue
            if os.path.basename(program) == name:
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """SIGTERM the node (it ends its own Ray processes), then SIGKILL whatever is left of its group; a node whose
        raylet is gone (a test killed it) has nothing to end gracefully, and its group is killed at once."""
        if self.process.poll() is None and self.pids("raylet"):
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group is this node's alone (start_new_session)
        except ProcessLookupError:
            pass
        self.process.wait()


@dataclass
class Cluster:
    """A running head and worker; `address` is what `--ray-address` takes."""

    address: str
    env: dict[str, str]
    nodes: list[Node] = field(default_factory=list)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


def _start_node(ip: str, options: list[str], env: dict[str, str], temp_dir: str) -> Node:
    os.makedirs(temp_dir, exist_ok=True)
    log = os.path.join(temp_dir, "ray_start.log")
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", f"--node-ip-address={ip}",
             "--num-cpus=1", f"--temp-dir={temp_dir}", "--disable-usage-stats", "--include-log-monitor=false",
             *options],
            stdout=out, stderr=subprocess.STDOUT, env={**env, **NODE_LOSS_SECONDS}, start_new_session=True)
    return Node(ip, process, log)


STARTED = "Ray runtime started."
"""The line `ray start` logs once its node's processes run (the worker's, once it reached the head's GCS)."""
LOG_LOOK_SECONDS = 0.1
"""How often the start looks at the nodes' logs for STARTED (a read of two small files), between waits for the
node not started yet to exit."""


def _started(node: Node) -> bool:
    with open(node.log, errors="replace") as f:
        return STARTED in f.read()


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    """How many nodes the cluster's GCS reports alive (0 while it is not up)."""
    script = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False);"
              "print(sum(n['Alive'] for n in ray.nodes()))")
    try:
        done = subprocess.run([sys.executable, "-c", script, address], env=env, capture_output=True, text=True,
                              timeout=POLL_SECONDS)
    except subprocess.TimeoutExpired:
        return 0
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def start_cluster(temp_root: str, env: dict[str, str]) -> Cluster:
    """Start the head and the worker node and wait (with a deadline) until both are alive.

    Raises RuntimeError, naming the node's log, when a node exits or the deadline passes.
    """
    for ip in (HEAD_IP, WORKER_IP):
        if problem := loopback_works(ip):
            raise RuntimeError(f"loopback address unusable: {problem}")
    ports = free_ports(2 * (len(NODE_PORT_OPTIONS) + WORKER_PORTS) + 1)
    head_options = _port_options(ports, head=True)
    port = next(o.split("=")[1] for o in head_options if o.startswith("--port="))
    cluster = Cluster(f"{HEAD_IP}:{port}", env)
    try:
        cluster.nodes.append(_start_node(HEAD_IP, ["--head", "--include-dashboard=false", *head_options], env, os.path.join(temp_root, "head")))
        cluster.nodes.append(_start_node(WORKER_IP, [f"--address={cluster.address}", *_port_options(ports, head=False)],
                                         env, os.path.join(temp_root, "worker")))
        deadline = time.monotonic() + START_SECONDS
        while True:
            for node in cluster.nodes:
                if node.process.poll() is not None:
                    raise RuntimeError(f"ray start on {node.ip} exited ({node.process.returncode}); see {node.log}")
            # Each look at the GCS is a Ray driver (seconds of CPU): ask it once both nodes say they started.
            waiting = [node for node in cluster.nodes if not _started(node)]
            if waiting:  # the node's exit ends the wait at once (and the check above names it)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    waiting[0].process.wait(LOG_LOOK_SECONDS)
            elif _alive_nodes(cluster.address, env) >= 2:
                return cluster
            if time.monotonic() > deadline:
                raise RuntimeError(f"two Ray nodes not alive after {START_SECONDS:.0f} s; see {cluster.nodes[0].log}")
    except BaseException:
        cluster.stop()
        raise
