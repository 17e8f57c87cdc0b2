"""TFRecord without TensorFlow: the framing of a record (framing.py), a file's byte stream (stream.py), its records
read and checked (records.py), files written (writer.py), and TFRecord as a batchtool format (format.py)."""
