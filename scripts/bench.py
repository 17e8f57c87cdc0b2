"""Benchmarks: one command, one table. Every batchtool job is measured in the same run as its floor
(the same I/O done with plain pyarrow/NumPy) and, where installed, its peer (tf.data, DuckDB).

    python scripts/bench.py --size 1GB                 # generate (or reuse) bench_data/1GB, run all jobs
    python scripts/bench.py --size 200MB --jobs "convert parquet->parquet,segment*"
    python scripts/bench.py --tf-python /path/to/venv/bin/python   # run the tf.data peers there

Each measurement is a separate subprocess, so peak RSS (from wait4) is that job's own.
Jobs live in scripts/benchjobs/*.py: each module defines `jobs(ctx) -> list[Job]`; floors and
peers are functions in those modules, run as `bench.py --call MODULE:FUNC ARGS_JSON`.
Results go to bench_results/latest.md and latest.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

BYTES_PER_ROW = {16: 2870}
"""Approximate zstd Parquet bytes per example at the benchmark shape (median 100 steps, 16 floats/step)."""


@dataclass(frozen=True)
class Context:
    data: str
    parquet: str
    tfrecord: str
    rows: int
    parquet_bytes: int
    tfrecord_bytes: int
    work: str
    threads: int
    tf_python: str | None


@dataclass(frozen=True)
class Command:
    """A measured process: batchtool CLI args, or a MODULE:FUNC call with JSON args."""

    batchtool: tuple[str, ...] = ()
    call: str | None = None
    args: dict = field(default_factory=dict)
    python: str | None = None


@dataclass(frozen=True)
class Job:
    name: str
    rows: int
    bytes: int
    ours: Command
    floor: Command | None = None
    peer: Command | None = None
    peer_name: str = ""
    note: str = ""
    output: str | None = None
    """The directory `ours` writes, measured for the disk column."""


@dataclass
class Measurement:
    seconds: float
    """The `seconds N` the command printed (time inside the process), else its wall time."""
    wall: float
    peak_rss: int
    output: str
    user: float
    """CPU seconds of the whole process (its start-up included) in user space and in the kernel (wait4)."""
    system: float


LAUNCHER = """
import json, os, subprocess, sys, time
for line in sys.stdin:
    job = json.loads(line)
    with open(job["out"], "w") as out, open(job["err"], "w") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(job["argv"], stdout=out, stderr=err, env=job["env"])
        _, status, usage = os.wait4(proc.pid, 0)
    print(json.dumps({"seconds": time.perf_counter() - start, "status": status, "maxrss": usage.ru_maxrss,
                      "user": usage.ru_utime, "system": usage.ru_stime}), flush=True)
"""
"""Runs the measured commands. Linux carries a process's peak RSS over fork and exec, so a command started by
bench.py itself (which may have just generated the corpus) would report bench.py's peak if larger than
its own; this small process, started first, passes on only its own few MiB."""


class Launcher:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, argv: list[str], env: dict[str, str], tmp: str) -> tuple[float, int, int, str, str, float, float]:
        """(wall seconds, wait status, peak RSS in bytes, stdout, stderr, user and system CPU seconds) of running
        argv."""
        out, err = os.path.join(tmp, "stdout.tmp"), os.path.join(tmp, "stderr.tmp")
        self.proc.stdin.write(json.dumps({"argv": argv, "env": env, "out": out, "err": err}) + "\n")
        self.proc.stdin.flush()
        done = json.loads(self.proc.stdout.readline())
        with open(out) as o, open(err) as e:
            return (done["seconds"], done["status"], done["maxrss"] * 1024, o.read(), e.read(), done["user"],
                    done["system"])


def measure(cmd: Command, ctx: Context, launcher: Launcher) -> Measurement | None:
    """Run one command in its own process and return wall time and that process's peak RSS."""
    if cmd.call:
        python = cmd.python or sys.executable
        argv = [python, os.path.join(HERE, "bench.py"), "--call", cmd.call, json.dumps(cmd.args)]
    else:
        argv = [sys.executable, "-m", "batchtool", *cmd.batchtool]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    seconds, status, peak, out, err, user, system = launcher.run(argv, env, ctx.data)
    if os.waitstatus_to_exitcode(status) != 0:
        print(f"  ! {' '.join(argv[:6])}... failed: {err.strip().splitlines()[-1] if err.strip() else status}",
              file=sys.stderr)
        return None
    inside = re.search(r"\bseconds ([0-9.]+)", out)
    return Measurement(float(inside.group(1)) if inside else seconds, seconds, peak, out, user, system)


def generate(size: str, root: str, tfrecord: bool = True) -> Context:
    """Write (or reuse) a corpus of about `size` of zstd Parquet, plus (unless tfrecord=False, which
    takes a fifth of the time) the same rows as GZIP-less TFRecord."""
    target = parse_size(size)
    rows = max(1000, target // BYTES_PER_ROW[16])
    data = os.path.join(root, size)
    marker = os.path.join(data, "DONE.json")
    done = json.load(open(marker)) if os.path.exists(marker) else {}
    if not (done.get("rows") == rows and (done.get("tfrecord", True) or not tfrecord)):
        from make_sample_data import write_corpus

        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data)
        print(f"generating {rows:,} examples in {data} ...", file=sys.stderr)
        write_corpus(data, rows, shards=max(2, min(16, target // (128 << 20))), seed=1,
                     tfrecord=tfrecord, parquet=True, median_length=100, max_length=2000, frame_dim=16,
                     tfrecord_compression=None)
        json.dump({"rows": rows, "tfrecord": tfrecord}, open(marker, "w"))
    return Context(data=data, parquet=os.path.join(data, "parquet"), tfrecord=os.path.join(data, "tfrecord"),
                   rows=rows, parquet_bytes=dir_bytes(os.path.join(data, "parquet")),
                   tfrecord_bytes=dir_bytes(os.path.join(data, "tfrecord")), work=os.path.join(data, "work"),
                   threads=os.cpu_count() or 1, tf_python=None)


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def parse_size(text: str) -> int:
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
    t = text.upper()
    for unit, mult in units.items():
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * mult)
    return int(t)


def all_jobs(ctx: Context) -> list[Job]:
    import benchjobs

    jobs: list[Job] = []
    for info in sorted(pkgutil.iter_modules(benchjobs.__path__), key=lambda m: m.name):
        jobs.extend(importlib.import_module(f"benchjobs.{info.name}").jobs(ctx))
    return jobs


def run_job(job: Job, ctx: Context, done: dict[str, Measurement], launcher: Launcher) -> dict:
    """Measure the job's commands; a floor or peer already measured in this run (`done`, keyed by command)
    is not run again, so jobs sharing one (a tf.data pipeline, say) are compared with the same figure."""
    shutil.rmtree(ctx.work, ignore_errors=True)
    os.makedirs(ctx.work)
    print(f"{job.name}:", file=sys.stderr)
    results = {}
    disk = None
    for role, cmd in (("ours", job.ours), ("floor", job.floor), ("peer", job.peer)):
        if cmd is None:
            continue
        if cmd.python is None and role == "peer" and cmd.call and ctx.tf_python and "tf" in cmd.call:
            cmd = Command(call=cmd.call, args=cmd.args, python=ctx.tf_python)
        key = json.dumps(asdict(cmd), sort_keys=True)
        m = done.get(key) if role != "ours" else None
        if m is None:
            m = measure(cmd, ctx, launcher)
            if role != "ours" and m is not None:
                done[key] = m
        if role == "ours" and m is not None and job.output:
            disk = dir_bytes(job.output)
        shutil.rmtree(ctx.work, ignore_errors=True)
        os.makedirs(ctx.work)
        if m is not None:
            results[role] = m
            print(f"  {role:5} {m.seconds:8.2f} s (wall {m.wall:.2f}, user {m.user:.2f}, sys {m.system:.2f})  "
                  f"peak {m.peak_rss / 2**20:7.0f} MiB  "
                  f"{m.output.strip()[-80:]}", file=sys.stderr)
    ours = results.get("ours")
    row = {"job": job.name, "rows": job.rows, "bytes": job.bytes, "note": job.note, "peer": job.peer_name}
    if ours:
        row.update(seconds=round(ours.seconds, 3), wall_seconds=round(ours.wall, 3),
                   rows_per_s=round(job.rows / ours.seconds),
                   mb_per_s=round(job.bytes / 2**20 / ours.seconds, 1), peak_rss_mib=round(ours.peak_rss / 2**20),
                   user_seconds=round(ours.user, 2), system_seconds=round(ours.system, 2))
    if disk is not None:
        row["disk_bytes"] = disk
    for role in ("floor", "peer"):
        if ours and role in results:
            row[f"{role}_seconds"] = round(results[role].seconds, 3)
            row[f"ratio_to_{role}"] = round(ours.seconds / results[role].seconds, 2)
            row[f"{role}_peak_rss_mib"] = round(results[role].peak_rss / 2**20)
            row[f"{role}_user_seconds"] = round(results[role].user, 2)
            row[f"{role}_system_seconds"] = round(results[role].system, 2)
    return row


def markdown(rows: list[dict], machine: str) -> str:
    lines = [f"Machine: {machine}", "",
             "| job | rows/s | MB/s | time (s) | vs floor (time ratio) | vs peer (time ratio) | CPU user + sys (s) "
             "| peak RSS | on disk |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "seconds" not in r:
            lines.append(f"| {r['job']} | failed | | | | | | | |")
            continue
        floor = f"{r['ratio_to_floor']:.2f}x" if "ratio_to_floor" in r else "-"
        peer = f"{r['ratio_to_peer']:.2f}x ({r['peer']})" if "ratio_to_peer" in r else "-"
        disk = f"{r['disk_bytes'] / 1e9:.2f} GB" if "disk_bytes" in r else "-"
        cpu = r["user_seconds"] + r["system_seconds"]
        lines.append(f"| {r['job']} | {r['rows_per_s']:,} | {r['mb_per_s']} | {r['seconds']} | {floor} | {peer} | "
                     f"{r['user_seconds']:.1f} + {r['system_seconds']:.1f} ({r['system_seconds'] / max(cpu, 1e-9):.0%} "
                     f"sys) | {r['peak_rss_mib']} MiB | {disk} |")
    lines += ["", "Ratios are time of batchtool / time of the floor or peer: below 1 is faster. Times are wall "
              "times of the process, or where the job prints one, the time inside it (interpreter and "
              "TensorFlow start-up excluded). CPU: user and system seconds of batchtool's whole process (start-up "
              "included; the share in the kernel in brackets). On disk: the bytes the job wrote."]
    return "\n".join(lines)


def machine_line() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, Python {platform.python_version()}"


def selected(name: str, wanted: list[str]) -> bool:
    return any(name.startswith(w[:-1]) if w.endswith("*") else name == w for w in wanted)


def call(target: str, args_json: str) -> None:
    module, func = target.split(":")
    importlib.import_module(f"benchjobs.{module}").__dict__[func](**json.loads(args_json))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1GB")
    parser.add_argument("--data-root", default=os.path.join(REPO, "bench_data"))
    parser.add_argument("--jobs", help="comma-separated job names; NAME* for every job whose name starts with NAME "
                                       "(default: all)")
    parser.add_argument("--tf-python", help="a Python with tensorflow for the tf.data peers")
    parser.add_argument("--no-tfrecord", action="store_true",
                        help="generate Parquet only (jobs that read TFRecord then fail)")
    parser.add_argument("--out", default=os.path.join(REPO, "bench_results"))
    parser.add_argument("--call", nargs=2, metavar=("MODULE:FUNC", "ARGS_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.call:
        call(*args.call)
        return
    launcher = Launcher()
    ctx = generate(args.size, args.data_root, tfrecord=not args.no_tfrecord)
    ctx = Context(**{**asdict(ctx), "tf_python": args.tf_python})
    wanted = args.jobs.split(",") if args.jobs else None
    done: dict[str, Measurement] = {}
    start_load = os.getloadavg()
    rows: list[dict] = []
    table = "no job selected"
    for job in all_jobs(ctx):
        if wanted is None or selected(job.name, wanted):
            rows.append(run_job(job, ctx, done, launcher))
            # after every job, so a stopped run keeps the rows it has
            table = write_results(rows, ctx, args.size, args.out, start_load)
    print(table)


def write_results(rows: list[dict], ctx: Context, size: str, out: str, start_load: tuple[float, ...]) -> str:
    """Write latest.md and latest.json from the rows so far; return the table."""
    machine = (f"{machine_line()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average (1, 5, 15 min) "
               f"{'/'.join(f'{x:.1f}' for x in start_load)} at start, "
               f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())} at end")
    table = markdown(rows, machine)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "latest.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(out, "latest.json"), "w") as f:
        json.dump({"machine": machine, "size": size, "rows": ctx.rows, "parquet_bytes": ctx.parquet_bytes,
                   "tfrecord_bytes": ctx.tfrecord_bytes, "results": rows}, f, indent=2)
    return table

if __name__ == "__main__":
    main()
