"""`python -m sm120` runs the CLI (tests use it to run the real command in a subprocess)."""

from sm120.core.startup import quiet_while_importing

# Under -m the package was imported before this module became __main__: guard the rest here.
quiet_while_importing()

from sm120.cli.app import main  # noqa: E402 - after the guard above

main()
