"""A tiny random model for exercising a real engine without downloading weights."""

from __future__ import annotations

from pathlib import Path

from sm120.core.errors import SM120Error
from sm120.core.paths import sm120_home
from sm120.engine.engine_env import Progress, stream_command
from sm120.engine.state import private_dir

# Run by path under the engine's Python: that interpreter has torch, sm120's does not.
BUILDER_SCRIPT = Path(__file__).with_name("tiny_model_builder.py")
# The one copy of the model's chat template: the builder writes it, refresh_chat_template
# keeps a model built by an older sm120 on it (the weights and tokenizer do not change).
CHAT_TEMPLATE_FILE = Path(__file__).with_name("tiny_chat_template.jinja")
TEMPLATE_NAME = "chat_template.jinja"


class TinyModelError(SM120Error):
    """The tiny model could not be built."""


def default_tiny_model_dir() -> Path:
    return sm120_home() / "models" / "tiny"


def ensure_tiny_model(engine_python: Path, dest: Path, progress: Progress) -> Path:
    """Build the tiny model into dest unless it is already there."""
    if (dest / "config.json").is_file():
        refresh_chat_template(dest, progress)
        return dest
    progress(f"building the tiny test model in {dest}")
    private_dir(dest.parent)  # models/ is 0700, as the rest of the state tree
    # -I: the builder's own directory (sm120/) must not shadow the engine's packages.
    argv = [str(engine_python), "-I", str(BUILDER_SCRIPT), str(dest)]
    try:
        result = stream_command(argv, progress)
    except OSError as exc:
        raise TinyModelError(
            f"cannot run {engine_python}: {exc}", hint="check --vllm-python / VLLM_PYTHON"
        ) from exc
    if result.returncode != 0:
        raise TinyModelError(
            f"building the tiny model failed (exit {result.returncode}):\n"
            + "\n".join(result.tail),
            hint=f"the engine at {engine_python} needs torch, transformers and tokenizers",
        )
    return dest


def refresh_chat_template(dest: Path, progress: Progress) -> None:
    """Bring an already built tiny model's chat template up to the shipped one.

    A model built before the template rendered tools keeps dropping them otherwise, and the
    model is built once per machine. Only sm120's own generated model is touched.
    """
    current = dest / TEMPLATE_NAME
    shipped = CHAT_TEMPLATE_FILE.read_text()
    if current.is_file() and current.read_text() == shipped:
        return
    progress(f"updating the tiny model's chat template in {dest}")
    current.write_text(shipped)
