"""What a user reads names TensorFlow's APIs, never "the seed": `seed` means `--seed`, the random seed, only.

Also: the manuals `--help` points to ship inside the package (`batchtool docs TOPIC`).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import resources

import pyarrow.parquet as pq
import pytest

from cli_help import COMMANDS, REPO, help_text
from memlimit import HANG_GUARD

SEED = re.compile(r"seed", re.IGNORECASE)
"""Every "seed" a user reads must be one of these phrasings of the random seed (or `--seed` itself)."""
RANDOM_SEED = re.compile("|".join([
    r"--seed\b",
    r"\bseeded\b",                                  # a seeded order, seeded shuffle
    r"\bseed\s*=\s*\d+",                            # seed=0 (Python), seed = 0 (TOML)
    r"[`\"]seed[`\"]",                              # the key `seed` / "seed" of a manifest, config or state
    r"\(seed, ",                                    # hash(seed, stage, id), (seed, epoch, ...)
    r"\bsame seed\b",
    r"\bseed of every random (decision|choice)\b",  # --seed's own help
    r"\bthe seed of the epochs' orders\b",
    r"\boptions?,? (the |and )?seed\b",             # the manifest records every option, the seed, ...
    r", seed(, |\))",                              # a list or signature naming the seed
    r"\bno seed\b",
    r"\bkeyed by the seed\b",
    r"\band seed give\b",
]), re.IGNORECASE)


def tensorflow_seed_words(text: str) -> list[str]:
    """Lines where "seed" is something other than the random seed (e.g. "the seed's", "seed equivalent")."""
    return [line for line in text.splitlines() if SEED.search(RANDOM_SEED.sub("", line))]


def user_texts() -> dict[str, str]:
    """Every text a user reads: `batchtool --help`, each command's `--help`, README.md and docs/*.md."""
    texts = {"batchtool --help": help_text(None)}
    texts.update({f"batchtool {c} --help": help_text(c) for c in COMMANDS})
    for path in [f"{REPO}/README.md", *sorted(glob.glob(f"{REPO}/docs/*.md"))]:
        with open(path, encoding="utf-8") as f:
            texts[os.path.relpath(path, REPO)] = f.read()
    return texts


def test_seed_means_only_the_random_seed_in_help_readme_and_docs():
    offending = {name: lines for name, text in user_texts().items() if (lines := tensorflow_seed_words(text))}
    assert not offending, "\n".join(f"{name}: {line.strip()}" for name, lines in offending.items() for line in lines)


@pytest.mark.parametrize("line", [
    "(the seed's bucket / bucket_by_sequence_length)", "| command | does | seed equivalent | docs |",
    "## Mapping to the seed", "Seed arguments with no offline meaning", "| option | meaning | seed argument |",
    "the way the seed does", "The seed logs this too", "## Seed mapping",
])
def test_the_check_flags_seed_meaning_tensorflow(line):
    assert tensorflow_seed_words(line) == [line]


@pytest.mark.parametrize("line", [
    "  --seed INTEGER  Seed of every random decision (same seed, same output bytes).",
    "`hash(seed, \"stratify\", id)`", "seed = 0", "loader = batchtool.load(\"out/\", seed=0)",
    "records the options, the seed, input files", "an exact seeded permutation",
])
def test_the_check_passes_the_random_seed(line):
    assert tensorflow_seed_words(line) == []


def test_the_help_texts_point_to_manuals_that_ship_in_the_package(run_cli):
    """A manual named in `--help` is package data (batchtool/docs/*.md), printed by `batchtool docs TOPIC` (here in
    process; the wheel test below runs it as a program, from an installed wheel)."""
    shipped = resources.files("batchtool") / "docs"
    named = {m for c in COMMANDS for m in re.findall(r"batchtool docs (\w+)", help_text(c))}
    assert {"check", "run", "bucket", "segment"} <= named
    for topic in sorted(named):
        manual = shipped / f"{topic}.md"
        assert manual.is_file(), topic
        done = run_cli("docs", topic)
        assert (done.exit_code, done.stderr) == (0, "")
        assert done.stdout == manual.read_text(encoding="utf-8")
    assert {p.removesuffix(".md") for p in os.listdir(f"{REPO}/docs")} == \
        {f.name.removesuffix(".md") for f in shipped.iterdir() if f.name.endswith(".md")}
    assert "docs/" not in "".join(help_text(c) for c in COMMANDS)


def test_docs_lists_topics_and_refuses_an_unknown_one_in_one_line(run_cli):
    listed = run_cli("docs")
    assert listed.exit_code == 0 and listed.stdout.splitlines()[0].startswith("benchmarks ")
    done = run_cli("docs", "buckets")
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr.startswith("error: docs 'buckets': no such topic; choose from benchmarks, bucket, check,")
    assert done.stderr.count("\n") == 1


def test_a_built_wheel_ships_the_manuals_and_prints_them(tmp_path):
    """The wheel pip builds (the way `pip install .` does: in an isolated environment with the build-system
    requirements of pyproject.toml, so nothing but pip is needed here) holds every docs/*.md, and installed with
    no checkout around, `batchtool docs TOPIC` prints them."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(f"{REPO}/{name}", source / name)
    for name in ("batchtool", "docs"):
        shutil.copytree(f"{REPO}/{name}", source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "wheel", "--no-deps",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=HANG_GUARD)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("batchtool-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {n for n in archive.namelist() if n.startswith("batchtool/docs/")}
        archive.extractall(tmp_path / "site")  # a pure-Python wheel installs as its files, where pip puts them
    assert shipped == {f"batchtool/docs/{name}" for name in os.listdir(f"{REPO}/docs") if name.endswith(".md")}
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run([sys.executable, "-m", "batchtool", "docs", "bucket"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=HANG_GUARD)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == open(f"{REPO}/docs/bucket.md", encoding="utf-8").read()


def test_no_text_a_user_reads_points_to_an_internal_issue():
    texts = user_texts()
    assert not [f"{name}: {line}" for name, text in texts.items() for line in text.splitlines()
                if re.search(r"\bissue\s*#?\d+", line, re.IGNORECASE)]


def test_the_readmes_batch_shapes_are_the_sample_datas():
    """README's training loop prints `[B, T, D]` for `frames`, with D the sample corpus's features per step."""
    schema = pq.read_schema(sorted(glob.glob(f"{REPO}/sample_data/parquet/*.parquet"))[0])
    per_step = schema.field("frames").type.value_type.list_size
    shapes = re.findall(r"\[B, T, (\d+)\]", user_texts()["README.md"])
    assert shapes and set(shapes) == {str(per_step)}
