"""The training side: batchtool.load and batchtool.source over an output's batches."""
