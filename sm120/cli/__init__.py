"""The `sm120` command line: one module per command group, registered in app.py."""
