"""`sm120 chat "..."`: talk to the running deployment (streams; reasoning dimmed)."""

from __future__ import annotations

import sys

import typer

from sm120.cli.errors import cli_errors


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


@cli_errors
def chat(
    prompt: str | None = typer.Argument(
        None, help="The message; stdin when piped; none: a session."
    ),
    name: str | None = typer.Option(None, "--name", help="Deployment."),
    no_think: bool = typer.Option(False, "--no-think", help="Ask the model not to reason."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Cap the answer length."),
    system: str | None = typer.Option(None, "--system", help="A system prompt."),
    no_stream: bool = typer.Option(False, "--no-stream", help="Wait for the whole answer."),
) -> None:
    """Send a message to the running server and stream the answer."""
    from sm120.lifecycle.chat import ChatSession

    session = ChatSession.for_deployment(
        name,
        system=system,
        thinking=False if no_think else None,
        max_tokens=max_tokens,
        stream=not no_stream,
    )
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read().strip()
    if prompt:
        session.ask(prompt)
        return
    session.interactive()
