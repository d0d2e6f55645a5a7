"""`python -m cisrank.cli`: the same command as the `cisrank` script."""

from cisrank.cli.app import main

main()
