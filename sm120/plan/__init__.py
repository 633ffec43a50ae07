"""From a recipe to a resolved launch plan: resolution (resolve.py), rules, overrides,
derivation from the checkpoint, the hardware model (facts handed in, never detected here),
GPU-set parsing, `sm120 validate` and the memory planner (fit/). No subprocess, HTTP or
Docker inside."""
