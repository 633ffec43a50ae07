"""The coding-agent session `sm120 test agent` replays: the tools, the system prompt, the turns.

Its shape is what Claude Code and Codex send: a long system prompt, tool definitions with
JSON schemas (Read / Edit / Bash / Grep, as those clients name them), then turns in which the
model calls a tool and the client answers with the tool's result. The results are scripted,
so every run sends the same conversation and the engine's prefix cache can serve each turn's
prompt up to the newest answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sm120.measure.cases import ToolSpec


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="Read",
        description="Read a file from the local filesystem. Lines are numbered from 1.",
        parameters={
            "type": "object",
            "properties": {
                "file_path": _string("The path of the file to read, relative to the project."),
                "offset": {"type": "integer", "description": "The line to start reading at."},
                "limit": {"type": "integer", "description": "How many lines to read."},
            },
            "required": ["file_path"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="Edit",
        description="Replace exact text in a file. old_string must occur in the file.",
        parameters={
            "type": "object",
            "properties": {
                "file_path": _string("The path of the file to change."),
                "old_string": _string("The text to replace, exactly as in the file."),
                "new_string": _string("The text to put in its place."),
                "replace_all": {"type": "boolean", "description": "Replace every occurrence."},
            },
            "required": ["file_path", "old_string", "new_string"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="Bash",
        description="Run a shell command in the project directory and return its output.",
        parameters={
            "type": "object",
            "properties": {
                "command": _string("The command to run."),
                "description": _string("What the command does, in five to ten words."),
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="Grep",
        description="Search file contents with a regular expression.",
        parameters={
            "type": "object",
            "properties": {
                "pattern": _string("The regular expression to search for."),
                "path": _string("The file or directory to search in."),
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
    ),
)

SYSTEM_PROMPT = """\
You are a coding agent working in a software project on the user's machine. You help the user
with software engineering tasks: fixing bugs, adding features, refactoring and explaining code.

# Tools
You act through the tools you are given. Read a file before you edit it. Make the smallest
change that solves the task. After a change, run the project's tests with the Bash tool and
read their output before you say that a task is done. Call one tool at a time and wait for
its result. Never invent a tool's output.

# Style
Be concise: answer in a few sentences unless the user asks for detail. Refer to code as
path:line. Do not add comments that only restate the code. Keep the project's existing
conventions (naming, formatting, test layout).

# Safety
Never run commands that delete data outside the project or reach the network unless the
user asks for it. Ask before you change files the task does not mention.

# Environment
Working directory: /home/user/ranges
Platform: linux
Is the directory a git repository: yes
"""

NOTES_HEADING = "\n# Project notes\n"
"""Generated filler sized to the deployment follows: real agents' prompts run to thousands
of tokens (tool documentation, memory files), which is what a prefix cache is for."""


@dataclass(frozen=True)
class Step:
    """One turn: what the client says, and the tool a capable model calls in answer."""

    say: str
    tool: str | None
    """None: the turn expects a text answer and no tool call."""
    arguments: dict[str, str] = field(default_factory=dict)
    """Argument -> regex its value must match (checked on real models only)."""
    result: str = ""
    """What the client answers the call with (the tool's output)."""


RANGES_PY = '''\
def parse_range(text):
    """'3-5' -> [3, 4, 5]; '7' -> [7]."""
    if "-" in text:
        start, end = text.split("-")
        return list(range(int(start), int(end)))
    return [int(text)]
'''

TEST_RANGES_PY = """\
from ranges import parse_range

def test_span():
    assert parse_range("3-5") == [3, 4, 5]

def test_single():
    assert parse_range("7") == [7]

def test_empty():
    assert parse_range("") == []
"""

STEPS: tuple[Step, ...] = (
    Step(
        "The tests in tests/test_ranges.py fail. Start by reading src/ranges.py.",
        "Read",
        {"file_path": r"src/ranges\.py"},
        RANGES_PY,
    ),
    Step(
        "The end of a range is inclusive. Fix parse_range in src/ranges.py with the Edit tool.",
        "Edit",
        {"file_path": r"ranges\.py", "old_string": r"range\("},
        "The file src/ranges.py has been updated.",
    ),
    Step(
        "Run the tests with pytest through the Bash tool.",
        "Bash",
        {"command": r"pytest"},
        "FAILED tests/test_ranges.py::test_empty - ValueError: invalid literal for int() "
        "with base 10: ''\n1 failed, 2 passed in 0.04s",
    ),
    Step(
        "Read tests/test_ranges.py to see what test_empty expects.",
        "Read",
        {"file_path": r"tests/test_ranges\.py"},
        TEST_RANGES_PY,
    ),
    Step(
        "Make parse_range return an empty list for an empty string, with the Edit tool.",
        "Edit",
        {"file_path": r"ranges\.py"},
        "The file src/ranges.py has been updated.",
    ),
    Step(
        "Run the tests again with the Bash tool.",
        "Bash",
        {"command": r"pytest"},
        "3 passed in 0.03s",
    ),
    Step(
        "Search the project for other uses of parse_range with the Grep tool.",
        "Grep",
        {"pattern": r"parse_range"},
        "src/cli.py:3:from ranges import parse_range\nsrc/cli.py:9:    pages = parse_range(arg)",
    ),
    Step(
        "Read src/cli.py to check that it still works with the fix.",
        "Read",
        {"file_path": r"src/cli\.py"},
        "import sys\n\nfrom ranges import parse_range\n\n\ndef main():\n"
        "    for arg in sys.argv[1:]:\n        pages = parse_range(arg)\n"
        "        print(len(pages))\n",
    ),
    Step(
        "Run the whole test suite once more with the Bash tool.",
        "Bash",
        {"command": r"pytest"},
        "12 passed in 0.11s",
    ),
    Step(
        "Summarise what you changed in two sentences. Do not call a tool.",
        None,
    ),
)


def tools_by_name() -> dict[str, ToolSpec]:
    return {tool.name: tool for tool in TOOLS}
