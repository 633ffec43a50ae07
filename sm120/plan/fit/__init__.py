"""The memory planner behind `sm120 plan`: weights per GPU, KV bytes per token, the KV pool,
the longest context and the concurrency a layout gives, before anything starts.

dims.py reads the checkpoint (the only I/O), kv.py models how the engine lays the KV cache
out, memory.py turns a resolved launch plan into numbers, recommend.py flags F08 / F24 and
picks a DCP / TP / max-model-len.
"""
