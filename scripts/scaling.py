"""Local engine vs a two-node Ray cluster on loopback, at several corpus sizes: the figures of docs/benchmarks.md (section scaling).

    python scripts/scaling.py --sizes 200,1000 --work bench_data/scaling
    python scripts/scaling.py --commands bucket,stratify --sizes 200 --json scaling.json

For each size (MB of zstd Parquet, made once by scripts/bench.py's `generate` and reused from --work), each
command runs on the local engine (--threads 2) and on a two-node cluster (tests/ray_cluster.py: head
127.0.0.2, worker 127.0.0.3, one CPU each, started once for the whole run and stopped by PID), each run in its
own process. Recorded: wall time, the driver's peak RSS (its own VmHWM, tests/memlimit.py), the peak RSS of
the Ray worker processes of each node (VmHWM read from /proc while the command runs: the largest process
and, when a node ran several, the sum of their peaks, which need not be simultaneous), the manifest's
`run.ray`, and whether both engines wrote the same data files (sha256 of each). Each output is deleted once
hashed.
Exit status 1 if a command failed or the engines' bytes differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [HERE, REPO, os.path.join(REPO, "tests")]

from bench import dir_bytes, generate, machine_line  # noqa: E402
from memlimit import batchtool  # noqa: E402
from ray_cluster import Cluster, start_cluster  # noqa: E402

from batchtool.io.manifest import output_files  # noqa: E402
from batchtool.io.manifest_reader import read_manifest  # noqa: E402

COMMANDS: dict[str, tuple[str, ...]] = {
    "shuffle": ("shuffle",),
    "bucket": ("bucket", "--auto-buckets", "8", "--batch-size", "32"),
    "stratify": ("stratify", "--label", "label", "--target", "uniform", "--batch-size", "64", "--balanced-batches"),
    "segment": ("segment", "--key", "key", "--sequence", "tokens,frames", "--num-unroll", "64", "--batch-size", "32"),
    "convert": ("convert",),
}
"""Each command's options after SRC DST. All but convert spill, so they get --tmp-dir under --work."""
LOCAL_THREADS = 2
NO_LIMIT = 1 << 50
"""memlimit's RSS cap, out of the way: this script measures, the tests bound."""
SAMPLE_SECONDS = 0.2
RAY_AGENTS = ("ray::DashboardA", "ray::RuntimeEnv")
"""Node processes named ray:: that are not workers (comm is cut at 15 characters)."""
HASH_BLOCK = 1 << 20


@dataclass
class Run:
    """One command on one engine."""

    command: str
    engine: str
    seconds: float
    driver_peak_mib: float
    error: str | None = None
    workers_peak_mib: dict[str, dict[str, float]] | None = None
    """Per node IP: `max` (largest worker process's VmHWM) and `sum` (of every worker process's VmHWM)."""
    ray: dict | None = None
    files: dict[str, str] | None = None
    """Data file name -> sha256."""
    output_bytes: int = 0


class WorkerPeaks:
    """The VmHWM of every Ray worker process of each node, sampled from /proc while a command runs.

    A node's processes are the session its `ray start --block` process leads (ray_cluster starts it with
    start_new_session); workers are the ones named ray::TASK or ray::IDLE. Workers are started per job (each
    command's driver), so each process's peak is that command's. A worker that ends between two samples is
    counted at its last sample.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.sessions = {node.process.pid: node.ip for node in cluster.nodes}
        self.peaks: dict[int, tuple[str, int]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> WorkerPeaks:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _watch(self) -> None:
        while True:
            self.sample()
            if self.done.wait(SAMPLE_SECONDS):
                return

    def sample(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
                session = int(stat[stat.rfind(")") + 2:].split()[3])
                if session not in self.sessions:
                    continue
                with open(f"/proc/{name}/status") as f:
                    fields = dict(line.split(":", 1) for line in f)
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
            comm = fields["Name"].strip()
            if comm.startswith("ray::") and not comm.startswith(RAY_AGENTS) and "VmHWM" in fields:
                self.peaks[int(name)] = (self.sessions[session], int(fields["VmHWM"].split()[0]) << 10)

    def by_node(self) -> dict[str, dict[str, float]]:
        nodes: dict[str, list[int]] = {}
        for ip, peak in self.peaks.values():
            nodes.setdefault(ip, []).append(peak)
        return {ip: {"max": round(max(p) / (1 << 20)), "sum": round(sum(p) / (1 << 20)), "processes": len(p)}
                for ip, p in sorted(nodes.items())}


def sha256_file(path: str) -> str:
    """Hashed here, not taken from the manifest: the comparison must not trust the writer being measured."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def run_command(name: str, src: str, dst: str, tmp: str, engine: str, cluster: Cluster | None) -> Run:
    """Run one command as its own process, measure it, hash its data files and delete its output."""
    args = [COMMANDS[name][0], src, dst, *COMMANDS[name][1:], "-q"]
    if name != "convert":
        args += ["--tmp-dir", tmp]
    peaks = None
    start = time.perf_counter()
    if cluster is None:
        done = batchtool(*args, "--threads", str(LOCAL_THREADS), limit_bytes=NO_LIMIT, timeout=1e6)
    else:
        with WorkerPeaks(cluster) as peaks:
            done = batchtool(*args, "--engine", "ray", "--ray-address", cluster.address, limit_bytes=NO_LIMIT,
                             timeout=1e6, env=cluster.env)
    run = Run(name, engine, round(time.perf_counter() - start, 1), round(done.peak_mib),
              workers_peak_mib=peaks.by_node() if peaks else None)
    try:
        if done.returncode != 0:
            run.error = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            return run
        manifest = read_manifest(dst)
        run.ray = manifest["run"].get("ray")
        run.files = {f.name: sha256_file(f.path) for f in output_files(dst, manifest)}
        run.output_bytes = dir_bytes(dst)
        return run
    finally:
        shutil.rmtree(dst, ignore_errors=True)


def corpus_line(size: str, parquet: str, rows: int) -> str:
    """What was measured, above each table: examples, bytes, files, row groups (one read task each)."""
    import pyarrow.parquet as pq

    files = sorted(os.listdir(parquet))
    groups = sum(pq.ParquetFile(os.path.join(parquet, f)).num_row_groups for f in files)
    return (f"{size}: {rows:,} examples, {dir_bytes(parquet) / 1e6:,.0f} MB of zstd Parquet in {len(files)} files "
            f"of {groups} row groups in all")


def mib(value: float) -> str:
    return f"{value:,.0f} MiB"


def megabytes(value: int) -> str:
    return f"{value / 1e6:,.1f} MB" if value >= 1e5 else f"{value / 1e3:,.0f} KB"


def same_bytes(run: Run, runs: list[Run]) -> bool | None:
    """Whether a Ray run wrote the data files its command's local run wrote; None when there is nothing to compare."""
    local = next((r for r in runs if r.command == run.command and r.engine == "local"), None)
    if run.engine != "ray" or run.error or local is None or local.error:
        return None
    return local.files == run.files


def worker_peak(node: dict[str, float]) -> str:
    """The largest worker process's peak, and the sum of all of them when the node ran several."""
    if node["processes"] == 1:
        return mib(node["max"])
    return f"{mib(node['max'])} ({node['processes']} processes, {mib(node['sum'])} summed)"


def table(runs: list[Run], nodes: list[str]) -> str:
    """One markdown row per run; `same bytes` on each Ray row, against the local run of its command."""
    lines = [f"| command | engine | wall time | driver peak RSS | workers' peak RSS ({' / '.join(nodes)}) "
             f"| tasks ({' / '.join(nodes)}) | to workers / to driver | same bytes |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | --- |"]
    for r in runs:
        if r.error:
            lines.append(f"| {r.command} | {r.engine} | failed after {r.seconds} s: {r.error} | | | | | |")
            continue
        workers = tasks = moved = same = "-"
        if r.engine == "ray":
            peaks = r.workers_peak_mib or {}
            workers = " / ".join(worker_peak(peaks[n]) if n in peaks else "-" for n in nodes)
            by_node = (r.ray or {}).get("tasks_by_node", {})
            tasks = " / ".join(str(by_node.get(n, 0)) for n in nodes)
            moved = f"{megabytes(r.ray['bytes_sent'])} / {megabytes(r.ray['bytes_received'])}" if r.ray else "-"
            same = {None: "-", True: "yes", False: "**NO**"}[same_bytes(r, runs)]
        lines.append(f"| {r.command} | {r.engine} | {r.seconds:,.1f} s | {mib(r.driver_peak_mib)} | {workers} | "
                     f"{tasks} | {moved} | {same} |")
    return "\n".join(lines)


def cluster_env() -> dict[str, str]:
    """The nodes' and the Ray drivers' environment: a token of their own (Ray 2.60 authenticates by default),
    and this checkout first on the path, so the workers import the batchtool being measured."""
    return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}


def measure(commands: list[str], src: str, work: str, cluster: Cluster) -> list[Run]:
    """Every command on both engines, local first; DST and --tmp-dir under work/out, removed after each run."""
    runs = []
    out = os.path.join(work, "out")
    for name in commands:
        for engine in ("local", "ray"):
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(os.path.join(out, "tmp"))
            try:
                run = run_command(name, src, os.path.join(out, "dst"), os.path.join(out, "tmp"), engine,
                                  cluster if engine == "ray" else None)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            print(f"  {name} {engine}: {run.error or f'{run.seconds} s'}", file=sys.stderr)
            runs.append(run)
    return runs


def main() -> None:
    """Make the corpora, start the cluster once, measure every size; one table per size, JSON after each."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="200,1000", help="corpus sizes in MB, comma-separated (default 200,1000)")
    parser.add_argument("--commands", default=",".join(COMMANDS),
                        help=f"comma-separated, of {','.join(COMMANDS)} (default all)")
    parser.add_argument("--work", default=os.path.join(REPO, "bench_data", "scaling"),
                        help="corpora (kept, reused) and outputs (deleted after each command)")
    parser.add_argument("--json", help="also write every run's figures here")
    args = parser.parse_args()
    commands = [n.strip() for n in args.commands.split(",") if n.strip()]
    if unknown := [n for n in commands if n not in COMMANDS]:
        parser.error(f"--commands {','.join(unknown)}: not one of {','.join(COMMANDS)}")
    sizes = [s.strip() for s in args.sizes.split(",")]
    if not all(s.isdigit() and int(s) > 0 for s in sizes):
        parser.error(f"--sizes {args.sizes}: whole numbers of MB, comma-separated")
    os.makedirs(args.work, exist_ok=True)
    corpora = {f"{s}MB": generate(f"{s}MB", args.work, tfrecord=False) for s in sizes}
    report: dict = {"machine": machine_line(), "sizes": {}}
    failed = False
    with tempfile.TemporaryDirectory(prefix="rc") as temp:  # short: Ray's socket paths must fit 107 bytes
        try:
            cluster = start_cluster(temp, cluster_env())
        except RuntimeError as exc:
            sys.exit(f"error: no two-node Ray cluster: {exc}")
        nodes = [node.ip for node in cluster.nodes]
        try:
            for size, ctx in corpora.items():
                corpus = corpus_line(size, ctx.parquet, ctx.rows)
                print(corpus, file=sys.stderr)
                runs = measure(commands, ctx.parquet, args.work, cluster)
                print(f"\n{corpus}\n\n{table(runs, nodes)}\n", flush=True)
                failed |= any(r.error or same_bytes(r, runs) is False for r in runs)
                report["sizes"][size] = {"corpus": corpus, "runs": [asdict(r) for r in runs]}
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(report, f, indent=1)
        finally:
            cluster.stop()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
