"""Datasets and their formats, statistics, manifests, outputs and spills: everything that reads or writes data."""
