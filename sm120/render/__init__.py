"""Pure renderers: a launch plan in, argv / environment / compose service out. No I/O."""
