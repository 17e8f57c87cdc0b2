"""tf.train.Example / tf.train.SequenceExample <-> Arrow record batches, without TensorFlow.

The codec's public names, from its parts: messages (the protobuf messages), columns (the Arrow
types a Feature holds), decode (records -> a batch), scan (records -> their schema), encode (a
batch -> records), ragged (NumPy helpers the decoder and encoder share).
"""

from batchtool.io.formats.example.columns import KINDS
from batchtool.io.formats.example.decode import decode_records
from batchtool.io.formats.example.encode import check_values, encode_records
from batchtool.io.formats.example.messages import (BytesList, Example, Feature, FeatureList, FeatureLists, Features,
                                                FloatList, Int64List, SequenceExample)
from batchtool.io.formats.example.scan import MAX_FEATURES, FeatureScan, infer_schema, scan_records

__all__ = ["KINDS", "MAX_FEATURES", "BytesList", "Example", "Feature", "FeatureList", "FeatureLists", "FeatureScan",
           "Features", "FloatList", "Int64List", "SequenceExample", "check_values", "decode_records", "encode_records",
           "infer_schema", "scan_records"]
