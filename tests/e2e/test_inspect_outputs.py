"""`inspect` on batchtool's batch outputs shows the examples' numbers, not the padding's."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.parquet as pq
from conftest import SAMPLE


def inspected(run_cli, path, *args) -> dict:
    result = run_cli("inspect", path, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def real_lengths(src) -> np.ndarray:
    return np.array([len(t) for t in pq.read_table(src, columns=["tokens"]).column("tokens").to_pylist()])


def test_bucket_output_lengths_are_the_real_lengths(tmp_path, parquet_src, run_cli):
    assert run_cli("bucket", parquet_src, tmp_path / "dst", "--length", "tokens", "--boundaries", "10,20",
                   "--batch-size", "8", "-q").exit_code == 0
    length = inspected(run_cli, tmp_path / "dst")["length"]
    lengths = real_lengths(parquet_src)
    assert length["column"] == "length" and length["count"] == len(lengths)
    assert (length["min"], length["max"]) == (lengths.min(), lengths.max())
    assert length["mean"] == round(float(lengths.mean()), 3)
    padded = inspected(run_cli, tmp_path / "dst", "--length", "tokens")["length"]  # asked for: the padded steps
    assert padded["mean"] > length["mean"]


def test_segment_output_shows_the_examples_and_the_segments_apart(tmp_path, parquet_src, run_cli):
    assert run_cli("segment", parquet_src, tmp_path / "dst", "--key", "key", "--sequence", "tokens",
                   "--num-unroll", "6", "--batch-size", "4", "-q").exit_code == 0
    result = inspected(run_cli, tmp_path / "dst")
    stats = json.load(open(tmp_path / "dst" / ".batchtool_manifest.json"))["stats"]
    labels = pq.read_table(parquet_src, columns=["label"]).column("label").to_numpy()
    assert result["label"]["counts"] == {str(k): int(v) for k, v in enumerate(np.bincount(labels))}
    lengths = real_lengths(parquet_src)
    assert result["length"]["count"] == 300 and result["length"]["max"] == lengths.max()
    assert sum(b["count"] for b in result["length"]["histogram"]) == 300
    assert result["segments"] == {"segments": stats["segments"], "examples": 300, "empty_slots": stats["empty_slots"],
                                  "lanes": 4, "ranks": 1}
    assert result["rows"] == stats["segments"] + stats["empty_slots"]
    text = run_cli("inspect", tmp_path / "dst").stdout
    assert f"segment output: {stats['segments']:,} segments of 300 examples in 4 lanes" in text
    assert re.search(r"  0 +[\d,]+ +\d+\.\d\d%", text)  # label shares are of the 300 examples
    shares = [float(m) for m in re.findall(r"^ +\d +[\d,]+ +(\d+\.\d\d)%", text, re.M)]
    assert abs(sum(shares) - 100) < 0.05


def test_run_output_gets_the_bucket_table_and_formatted_numbers(tmp_path, run_cli):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(open(f"{SAMPLE}/pipeline.toml").read().replace('path = "parquet"', f'path = "{SAMPLE}/parquet"')
                        .replace('path = "out"', f'path = "{tmp_path}/out"'))
    assert run_cli("run", pipeline, "-q").exit_code == 0
    text = run_cli("inspect", tmp_path / "out").stdout
    assert "buckets (padding efficiency = real / padded elements)" in text
    assert "  stage 1 stratify: 4,000 rows in, 164 out" in text
    assert re.search(r"^  rows_in: 4,000$", text, re.M) and re.search(r"^  padding_efficiency: \d+\.\d\d%$", text, re.M)
    assert re.search(r"^lengths \(length\): .* mean 41\.793$", text, re.M)  # the real lengths, not the padded
