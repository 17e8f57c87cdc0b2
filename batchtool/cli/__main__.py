"""`python -m batchtool.cli`: the same as the `batchtool` command."""

from batchtool.cli import main

main()
