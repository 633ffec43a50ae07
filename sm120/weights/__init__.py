"""Model weights: check a checkpoint folder (`verify`), fetch one from the Hugging Face Hub
(`download`), and make sure `launch` serves a complete one (`ensure`).

Submodules import huggingface_hub only inside the functions that talk to the Hub, so
verifying a folder never pays for it.
"""
