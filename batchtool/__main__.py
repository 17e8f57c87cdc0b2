"""`python -m batchtool`: the same as the `batchtool` command."""

from batchtool.entry import main

main()
