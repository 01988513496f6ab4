"""`python -m autoconfig.cli`: the same as the `autoconfig` command."""

from autoconfig.cli import main

main()
