import time

__version__ = "0.1.0"
# When this process imported sm120 (time.monotonic()): `sm120 launch --json` counts its own
# start-up (imports included) from here.
IMPORTED_AT = time.monotonic()

from sm120.core.startup import quiet_while_importing  # noqa: E402 - after the clock above

quiet_while_importing()
