"""`python -m batchtool`: the same as the `batchtool` command."""

from batchtool.cli import main

main()
