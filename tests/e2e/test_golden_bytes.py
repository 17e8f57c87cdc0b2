"""Every command writes the bytes it wrote before: sha256 of each data file and of the manifest's
deterministic sections, for a fixed list of runs on sample_data/, against tests/data/golden_sha256.json.

A refactor must not change output. When a change is meant to (a fix another issue asks for), re-record
with `BATCHTOOL_RECORD_GOLDEN=1 python -m pytest tests/e2e/test_golden_bytes.py` and say in the commit which
runs changed and why.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from conftest import SAMPLE

from batchtool.io.manifest import MANIFEST_NAME

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "golden_sha256.json")
RECORD = os.environ.get("BATCHTOOL_RECORD_GOLDEN") == "1"
PARQUET = os.path.join(SAMPLE, "parquet")
TFRECORD = os.path.join(SAMPLE, "tfrecord")

PIPELINE = """
seed = {seed}
memory = "{memory}"
[input]
path = "{src}"
[[stage]]
op = "select"
columns = ["key", "label", "tokens", "frames"]
[[stage]]
op = "stratify"
label = "label"
target = "uniform"
mode = "bernoulli"
[[stage]]
op = "shuffle"
[[stage]]
op = "rename"
columns = {{ tokens = "ids" }}
[[stage]]
op = "bucket"
length = "ids"
auto-buckets = 3
batch-size = 16
[output]
path = "{dst}"
format = "{to}"
"""

SEGMENT = ["segment", "--key", "key", "--sequence", "tokens,frames", "--num-unroll", "20", "--batch-size", "8"]
RUNS: dict[str, list[str]] = {
    "convert-tfrecord": ["convert", "--to", "tfrecord"],
    "convert-arrow": ["convert", "--to", "arrow"],
    "convert-from-tfrecord": ["convert", "--to", "parquet", "--src", TFRECORD],
    "stratify-exact": ["stratify", "--target", "uniform", "--seed", "1"],
    "stratify-bernoulli": ["stratify", "--target", "0.4,0.3,0.2,0.1", "--mode", "bernoulli", "--seed", "2"],
    "stratify-online": ["stratify", "--target", "uniform", "--mode", "online", "--num-classes", "4",
                        "--seed", "3"],
    "stratify-balanced": ["stratify", "--target", "uniform", "--batch-size", "8", "--balanced-batches",
                          "--seed", "4"],
    "stratify-balanced-parquet": ["stratify", "--target", "uniform", "--batch-size", "8", "--balanced-batches",
                                  "--seed", "4", "--to", "parquet"],
    "resample-rate": ["resample", "--rate", "1.7", "--seed", "5"],
    "resample-weight": ["resample", "--weight", "weight", "--overall-rate", "0.5", "--seed", "6"],
    "shuffle-global": ["shuffle", "--seed", "8", "--memory", "256KB"],
    "shuffle-buffer": ["shuffle", "--buffer", "100", "--seed", "9"],
    "bucket-auto": ["bucket", "--auto-buckets", "4", "--batch-size", "16", "--mask", "--seed", "10"],
    "bucket-auto-parquet": ["bucket", "--auto-buckets", "4", "--batch-size", "16", "--mask", "--seed", "10",
                            "--to", "parquet"],
    "bucket-boundaries-tfrecord": ["bucket", "--boundaries", "20,40,60", "--batch-size", "8", "--to", "tfrecord",
                                   "--seed", "11"],
    "bucket-balance-arrow": ["bucket", "--auto-buckets", "3", "--batch-size", "8", "--balance", "label",
                             "--to", "arrow", "--seed", "12"],
    "bucket-max-tokens": ["bucket", "--auto-buckets", "3", "--max-tokens", "2048", "--memory", "256KB",
                          "--seed", "13"],
    "pack": ["pack", "--max-length", "512", "--sequence", "tokens", "--batch-size", "8", "--seed", "14"],
    "pack-parquet": ["pack", "--max-length", "512", "--sequence", "tokens", "--batch-size", "8", "--seed", "14",
                     "--to", "parquet"],
    "segment": SEGMENT,
    "segment-parquet": SEGMENT + ["--to", "parquet"],
    "segment-tfrecord": SEGMENT + ["--to", "tfrecord"],
    "segment-arrow-lanes": SEGMENT + ["--to", "arrow", "--world-size", "2"],
    "mix-weights": ["mix", "--src", PARQUET, "--src", TFRECORD, "--weights", "parquet=0.7,tfrecord=0.3",
                    "--seed", "20", "--memory", "256KB"],
    "mix-batches": ["mix", "--src", PARQUET, "--src", TFRECORD, "--temperature", "1", "--replacement", "--size",
                    "5000", "--batch-size", "16", "--seed", "21"],
    "pipeline-parquet": ["run", "--seed", "18", "--memory", "256KB", "--to", "parquet"],
    "pipeline-arrow": ["run", "--seed", "19", "--memory", "64MB", "--to", "arrow"],
}
RUNNERS = (("local", 1), ("local", 2), ("processes", 2))
"""(--engine, --threads): every engine (core.run_settings.ENGINES) that runs without an extra writes the same bytes."""
ON_PROCESSES = {"convert-from-tfrecord", "stratify-balanced", "shuffle-global", "bucket-auto", "pack", "segment",
                "segment-arrow-lanes", "mix-batches", "pipeline-parquet"}
"""The runs the process engine repeats: each kind of plan (rows, an exchange, balanced quotas, a stream, a mix,
a pipeline) and each road its workers take (spilled cells, worker-written shards); every run of the local engine
at two thread counts. A process pool's start makes each run there cost twice a local one."""
assert ON_PROCESSES <= set(RUNS), ON_PROCESSES - set(RUNS)


def invocation(name: str, dst: str, pipeline_dir: str, threads: int) -> list[str]:
    """The argv of one run: SRC and DST spliced in after the command; pipelines get a TOML file."""
    args = list(RUNS[name])
    if args[0] == "run":
        opts = dict(zip(args[1::2], args[2::2]))
        path = os.path.join(pipeline_dir, f"{name}.toml")
        with open(path, "w") as f:
            f.write(PIPELINE.format(seed=opts["--seed"], memory=opts["--memory"], to=opts["--to"], src=PARQUET,
                                    dst=dst))
        return ["run", path, "--threads", str(threads), "-q"]
    srcs = []
    while "--src" in args:  # a command's SRC (mix: each of its sources), if not sample_data/parquet
        i = args.index("--src")
        srcs.append(args[i + 1])
        del args[i:i + 2]
    return [args[0], *(srcs or [PARQUET]), dst, *args[1:], "--threads", str(threads), "-q"]


def digests(dst: str, tmp: str) -> dict[str, str]:
    """sha256 of every data file, and of the manifest without its run section (times, memory, engine)
    and with this machine's paths (the checkout, the test's temporary directory) made placeholders."""
    out = {}
    for name in sorted(os.listdir(dst)):
        with open(os.path.join(dst, name), "rb") as f:
            data = f.read()
        if name == MANIFEST_NAME:
            manifest = json.loads(data)
            manifest.pop("run", None)
            text = json.dumps(manifest, sort_keys=True)
            data = text.replace(tmp, "<TMP>").replace(SAMPLE, "<SAMPLE>").encode()
        out[name] = hashlib.sha256(data).hexdigest()
    return out


@pytest.fixture(scope="module")
def golden() -> dict[str, dict[str, str]]:
    if RECORD or not os.path.exists(GOLDEN):
        return {}
    with open(GOLDEN) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def recorded():
    found: dict[str, dict[str, str]] = {}
    yield found
    if RECORD:
        with open(GOLDEN, "w") as f:
            json.dump(dict(sorted(found.items())), f, indent=1, sort_keys=True)
            f.write("\n")


@pytest.mark.parametrize("name,engine,threads", [(name, engine, threads) for name in sorted(RUNS)
                                                  for engine, threads in RUNNERS
                                                  if engine != "processes" or name in ON_PROCESSES])
def test_same_bytes_as_before(run_cli, tmp_path, golden, recorded, name: str, engine: str, threads: int) -> None:
    dst = str(tmp_path / "out")
    result = run_cli(*invocation(name, dst, str(tmp_path), threads), "--engine", engine)
    assert result.exit_code == 0, result.stderr
    found = digests(dst, str(tmp_path))
    if RECORD:
        recorded.setdefault(name, found)
        assert recorded[name] == found, f"{name}: --engine {engine} --threads {threads}: other bytes than the first"
        return
    assert name in golden, f"{name}: not recorded in {GOLDEN}"
    changed = sorted(f for f in set(found) | set(golden[name]) if found.get(f) != golden[name].get(f))
    assert not changed, f"{name} --engine {engine} --threads {threads}: these files changed: {changed}"
