"""Shard formats: Parquet and TFRecord readers and writers, apart from any operation."""
