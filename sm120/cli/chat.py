"""`sm120 chat "..."`: talk to the running deployment (streams; reasoning dimmed)."""

from __future__ import annotations

import sys

import typer

from sm120.cli.errors import cli_errors
from sm120.cli.options import DeploymentOpt, NoThinkRequestOpt


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


@cli_errors
def chat(
    prompt: str | None = typer.Argument(
        None, help="The message; stdin when piped; none: a session."
    ),
    name: DeploymentOpt = None,
    no_think: NoThinkRequestOpt = False,
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Cap the answer length."),
    system: str | None = typer.Option(None, "--system", help="A system prompt."),
    no_stream: bool = typer.Option(False, "--no-stream", help="Wait for the whole answer."),
) -> None:
    """Send a message to the running server and stream the answer."""
    from sm120.deploy.chat import ChatSession

    if prompt is None and not sys.stdin.isatty():
        prompt = _piped_prompt()
    session = ChatSession.for_deployment(
        name,
        system=system,
        thinking=False if no_think else None,
        max_tokens=max_tokens,
        stream=not no_stream,
    )
    if prompt:
        session.ask(prompt)
        return
    session.interactive()


# A prompt is text a person wrote or a file of it; far below what a server would accept.
MAX_PROMPT_BYTES = 16 << 20


def _piped_prompt() -> str:
    from sm120.core.bounded import decode_text, size_words
    from sm120.core.errors import SM120Error

    hint = "pipe UTF-8 text, e.g. cat notes.txt | sm120 chat"
    data = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)
    if len(data) > MAX_PROMPT_BYTES:
        raise SM120Error(f"the piped prompt is larger than {size_words(MAX_PROMPT_BYTES)}", hint)
    return decode_text(data, "the piped prompt", hint).strip()
