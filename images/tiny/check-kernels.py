"""Load the CPU kernel library vLLM will pick on this CPU, so a missing system library (libnuma)
fails the build rather than the first launch. vLLM itself only logs a warning when the load
fails (vllm/platforms/cpu.py import_kernels), and importing vllm._C directly runs AVX-512 code
on CPUs without it."""

import ctypes
from pathlib import Path

import torch
import vllm

if torch.cpu._is_avx512_bf16_supported():
    name = "_C"
elif torch.cpu._is_avx512_supported():
    name = "_C_AVX512"
else:
    name = "_C_AVX2"
library = next(Path(vllm.__file__).parent.glob(f"{name}.*.so"))
ctypes.CDLL(str(library))
print(f"check-kernels: {library.name} loads")
