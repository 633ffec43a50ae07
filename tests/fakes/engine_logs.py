"""Engine log lines as vLLM prints them, quoted from real runs (seeds, issue threads), that
the log, failure and watchdog tests feed their parsers."""

from __future__ import annotations

# The healthy startup sequence of seed 000 (vLLM 0.15.1, 4x RTX PRO 6000, GLM-4.7-NVFP4).
SEED_000_HEALTHY = [
    "[Worker] Using 'VLLM_CUTLASS' NvFp4 MoE backend",
    "[Worker] Using AttentionBackendEnum.TRITON_ATTN backend.",
    "[Worker] Loading safetensors checkpoint shards: 100% | 41/41",
    "[Worker] Loading weights took 13.96 seconds",
    "[Worker] WARNING: Checkpoint does not provide a q scaling factor ...  ← benign",
    "[Worker] Model loading took 47.11 GiB memory and 14.96 seconds",
    "[Worker] torch.compile: Dynamo bytecode transform: 10.40 s",
    "[Worker] Compiling graph for compile range (1, 8192): 12.23 s",
    "[Worker] Available KV cache memory: 31.99 GiB",
    "[EngineCore] GPU KV cache size: 729,248 tokens",
    "[Worker] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 51/51",
    "[Worker] Capturing CUDA graphs (decode, FULL): 51/51",
    "[APIServer] Application startup complete.",
]


# Real log text for every entry that has a signature: from the seeds in shared/seeds/ and
# public issue threads / logs quoted in shared/reference/. Each line must trigger exactly
# its own entry.
REAL_LINES: dict[str, list[str]] = {
    "F01": ["    prefill_wrapper.plan(...)"],
    "F02": [
        "ValueError: Unknown attention backend: 'TRITON'. Valid options are: FLASH_ATTN, "
        "TRITON_ATTN, ..."
    ],
    "F03": [
        "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy "
        "requests."
    ],
    "F04": ["KeyError: 'layers.41.self_attn.qkv_proj.k_scale'"],
    "F05": [
        "(APIServer pid=1) ERROR 02-21 10:00:00 [glm4_moe_tool_parser.py:120] "
        "Failed to parse tool call",
        "(APIServer pid=1) ERROR 02-21 10:00:00 [serving.py:90] Failed to extract tool call spec",
    ],
    "F07": ["AttributeError: module 'torch' has no attribute 'nvfp4'"],
    "F07b": [
        "RuntimeError: Error in function 'TllmGenFmhaRunner' at .../trtllm/fmha/fmhaRunner.cuh:",
        "RuntimeError: Error in function 'TllmGenFmhaRunner' at /src/fmhaRunner.cuh:212: "
        "Unsupported architecture",
    ],
    "F08": [
        "ValueError: To serve at least one request with the models's max seq len (250000), "
        "(14.49 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(10.30 GiB). Based on the available memory, the estimated maximum model length is "
        "177728. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.",
        "ValueError: To serve at least one request with the model's max seq len (250000), "
        "(14.49 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(10.30 GiB).",
        "Based on the available memory, the estimated maximum model length is 177728.",
    ],
    "F09": [
        "WARNING 06-19 10:00:00 [deepseek_v2.py:771] index_topk_pattern is shorter than "
        "num_hidden_layers; not skipping sparse MLA indexer computation on layer 77."
    ],
    "F10b": [
        "RuntimeError: CUDA error: peer access is not supported between these two devices",
        "transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle : 217 peer access is not "
        "supported between these two devices",
    ],
    "F14": [
        "AssertionError: DeepseekV4 only supports fp8 kv-cache format for now",
        "AssertionError: DeepseekV4 fp8_ds_mla layout only supports fp8 kv-cache, got auto",
        "    assert self.store_dtype == torch.uint8",
    ],
    "F15": [
        "RuntimeError: Assertion error (csrc/apis/layout.hpp:59): Unknown SF transformation",
        "RuntimeError: Assertion sf.size(-2) == ceil_div(mn, gran_mn) failed",
    ],
    "F16": [
        "WARNING sparse_mla_env.py:101 Disabling CUDA graphs for the DeepSeek V4 Triton",
    ],
    "F17": [
        "WARNING 04-21 12:32:10 [envs.py:1744] Unknown vLLM environment variable detected: "
        "VLLM_SM120_REFERENCE_TOPK_CHUNK_SIZE",
        "WARNING [envs.py:1900] Unknown vLLM environment variable detected: VLLM_ATTENTION_BACKEND",
    ],
    "F18": [
        "ValueError: Free memory on device cuda:0 (2.21/94.97 GiB) on startup is less",
        "ValueError: Free memory on device cuda:0 (2.21/94.97 GiB) on startup is less than "
        "desired GPU memory utilization (0.93, 88.32 GiB).",
        "ValueError: Free memory on device (2.21/94.97 GiB) on startup is less than desired GPU "
        "memory utilization (0.93, 88.32 GiB). Decrease GPU memory utilization or reduce GPU "
        "memory used by other processes.",
    ],
    "F19": [
        "RuntimeError: flashinfer-cubin version (0.6.8.post1) does not match flashinfer version "
        "(0.5.3). Please install the same version of both packages. Set "
        "FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check.",
        "RuntimeError: flashinfer-cubin version (0.6.13) does not match",
    ],
    "F20": ["    assert logits.dtype == torch.float32"],
    "F22": [
        "(EngineCore pid=395) INFO 07-12 02:35:01 [shm_broadcast.py:705] No available shared "
        "memory broadcast block found in 60 seconds. This typically happens when some processes "
        "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
        "quantization).",
        "INFO [shm_broadcast.py:548] No available shared memory broadcast block found in 60 "
        "second.",
    ],
    "F28": ["get_pip_packages -> 'NoneType' object has no attribute 'splitlines'"],
    # eugr/spark-vllm-docker#307, vLLM 0.23.1rc1.dev448 loading Salyut1/GLM-4.7-NVFP4
    "F29": [
        "TypeError: KVCacheScaleParameter.weight_loader() takes 2 positional arguments but 3 "
        "were given"
    ],
    # vllm-project/vllm#56837 (vLLM 0.29.1rc1.dev9, DeepSeek-V4.1-Flash on sm_120)
    "F30": [
        "ValueError: SM120 sparse-MLA has no decode kernel for this shape: num_tokens=16, "
        "num_heads=64, topk=1152"
    ],
    # vllm-project/vllm#56281: the source line the traceback prints above 'AssertionError: 4096 20'
    "F31": ["    assert num_tokens_across_dp_cpu[dp_rank] == batchsize, ("],
    # sgl-project/sglang#31578 (SGLang with FlashMLA sparse prefill on by default, SM120)
    "F33": [
        "RuntimeError: Sparse Attention Forward Kernel is only supported on SM90a and SM100f "
        "architectures."
    ],
}


PREFIXES = [
    "",
    "vllm-1  | ",
    "glm52-vllm-1  | (EngineCore_DP0 pid=12) ",
    "(Worker_TP0 pid=3) ERROR 11-20 10:00:00 [multiproc_executor.py:671] ",
    "(RayWorkerWrapper pid=77, ip=10.0.0.2) (Worker_TP1 pid=4) ",
    "Nov 20 10:00:00 box docker[812]: ",
    "2026-11-20T10:00:00.123456789Z ",
    "\x1b[1;36m(EngineCore_DP0 pid=12)\x1b[0;0m \x1b[31mERROR\x1b[0m ",
]


# A healthy start of a current vLLM with the lines that look alarming but are not.
HEALTHY_NOISE = [
    "(APIServer pid=1) WARNING 07-02 21:58:11 [envs.py:2027] Unknown vLLM environment variable "
    "detected: VLLM_BUILD_COMMIT",
    "(APIServer pid=1) WARNING 07-02 21:58:11 [envs.py:2027] Unknown vLLM environment variable "
    "detected: VLLM_IMAGE_TAG",
    "(Worker_TP0 pid=3) WARNING 06-19 10:00:00 [custom_all_reduce.py:150] Custom allreduce is "
    "disabled because it's not supported on more than two PCIe-only GPUs. To silence this "
    "warning, specify disable_custom_all_reduce=True explicitly.",
    "(Worker_TP0 pid=3) INFO 06-19 10:00:00 [deepseek_v2.py:1085] Using index_topk_pattern/"
    "index_topk_freq to skip sparse MLA indexer computation on layer 3.",
    "(Worker_TP0 pid=3) INFO 06-19 10:00:00 [mla_attention.py:300] Using DeepSeek's fp8_ds_mla "
    "KV cache format.",
    "(EngineCore_DP0 pid=2) INFO 06-19 10:05:00 [kv_cache_utils.py:1087] GPU KV cache size: "
    "710,593 tokens",
    "(EngineCore_DP0 pid=2) INFO 06-19 10:05:00 [kv_cache_utils.py:1090] Maximum concurrency for "
    "250,000 tokens per request: 2.84x",
    "(EngineCore_DP0 pid=2) INFO 06-19 10:12:00 [core.py:250] init engine (profile, create kv "
    "cache, warmup model) took 412.55 seconds",
    "(APIServer pid=1) INFO 06-19 10:12:01 [api_server.py:1700] Starting vLLM API server 0 on "
    "http://0.0.0.0:8000",
    "(APIServer pid=1) INFO:     Application startup complete.",
    # PCIe boxes without P2P: vLLM falls back to NCCL, which is not a failure by itself.
    "(Worker_TP1 pid=4) WARNING 05-13 08:48:35 custom_all_reduce.py:166] Custom allreduce is "
    "disabled because your platform lacks GPU P2P capability or P2P test failed. To silence "
    "this warning, specify disable_custom_all_reduce=True explicitly.",
    "host:3312:3312 [1] NCCL INFO P2P is disabled between connected GPUs 0 and 1. You can "
    "repress this message with NCCL_IGNORE_DISABLED_P2P=1.",
    "(APIServer pid=1) INFO 06-19 10:13:00 [loggers.py:123] Engine 000: Avg prompt throughput: "
    "0.0 tokens/s, Avg generation throughput: 52.3 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
    "GPU KV cache usage: 3.1%, Prefix cache hit rate: 45.0%",
]


COMPILE_LINE = (
    "(EngineCore pid=12) INFO 06-21 10:00:00 [backends.py:383] Cache the graph of compile range "
    "(8193, 16384) for later use"
)
