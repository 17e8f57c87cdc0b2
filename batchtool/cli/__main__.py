"""`python -m batchtool.cli`: the same as the `batchtool` command (use `python -m batchtool`, whose
signal handling is in place before the command modules are imported)."""

from batchtool.entry import main

main()
