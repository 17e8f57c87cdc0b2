"""The column a mix adds to every row, saying which source the row comes from: declared apart from io/mixed.py (which
reads the sources, with arrays) so that mix's options, and so `mix --help`, import no NumPy or pyarrow."""

SOURCE = "source"
"""The column saying each row's source (its index), unless renamed (`--output-column source=NAME`)."""
