"""tf.train.Example / tf.train.SequenceExample <-> Arrow record batches, without TensorFlow.

The codec's public names, from its parts: messages (the protobuf messages), columns (the Arrow
types a Feature holds), decode (records -> a batch), scan (records -> their schema), encode (a
batch -> records), ragged (NumPy helpers the decoder and encoder share).
"""

from batchtool.core.registry import exports

_PARTS = {
    "columns": ("KINDS",),
    "decode": ("decode_records",),
    "encode": ("check_values", "encode_records"),
    "messages": ("BytesList", "Example", "Feature", "FeatureList", "FeatureLists", "Features", "FloatList", "Int64List",
                 "SequenceExample"),
    "scan": ("MAX_FEATURES", "FeatureScan", "infer_schema", "scan_records"),
}
"""Each part's public names, imported when first used: the protobuf messages only once a record is read or written
(TFRecord's options and --help need KINDS alone)."""
__getattr__ = exports(globals(), {name: (f"{__name__}.{part}", name) for part, names in _PARTS.items()
                                  for name in names})

__all__ = ["KINDS", "MAX_FEATURES", "BytesList", "Example", "Feature", "FeatureList", "FeatureLists", "FeatureScan",
           "Features", "FloatList", "Int64List", "SequenceExample", "check_values", "decode_records", "encode_records",
           "infer_schema", "scan_records"]
