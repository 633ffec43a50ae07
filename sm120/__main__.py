"""`python -m sm120` runs the CLI (tests use it to run the real command in a subprocess)."""

from sm120.cli.app import main

main()
