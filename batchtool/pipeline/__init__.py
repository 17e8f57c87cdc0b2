"""Pipelines: several operations chained in one streaming, multithreaded run (`batchtool run PIPELINE.toml`)."""

from __future__ import annotations

from batchtool.pipeline.config import PipelineConfig, load  # first: it registers the commands it reads
from batchtool.pipeline.execute import PipelineResult, run_pipeline

__all__ = ["PipelineConfig", "PipelineResult", "load", "run_pipeline"]
