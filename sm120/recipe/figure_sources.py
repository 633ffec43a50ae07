"""Whether each published figure of a recipe can be found again as it was read.

A figure's `date` says when it was measured (the schema requires it); its `source` must also
say which text it was read in. A pull request, issue or discussion is a thread: the figure's
date places it there. A file in a repository is not: the branch it was read on moves, so the
link must name the commit (`/blob/<commit>/...`, `/tree/<commit>/...`, `/commit/<commit>`).
An acceptance figure's source is free text: it must name a commit or a date.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from sm120.recipe.schema import Published, Recipe

_HEX = r"[0-9a-f]{7,40}"
# github.com/<owner>/<repo>/(pull|issues|discussions)/<n>: a dated thread
_THREAD = re.compile(r"^https?://github\.com/[^/]+/[^/]+/(pull|issues|discussions)/\d+")
# a file, folder or repository link on a code host: the part after the repository
_CODE_HOST = re.compile(
    r"^https?://(github\.com|huggingface\.co|raw\.githubusercontent\.com)/[^/]+/[^/?#]+(?P<rest>.*)$"
)
_PINNED_REF = re.compile(rf"^/(blob|tree|raw|resolve|commit)/{_HEX}(/|$|[?#])")
_RAW_PINNED = re.compile(rf"^/{_HEX}/")
_NAMES_COMMIT_OR_DATE = re.compile(rf"\b{_HEX}\b|\b\d{{4}}-\d{{2}}(-\d{{2}})?\b")


def unpinned_link(source: str) -> str | None:
    """Why `source` does not pin the text a figure was read in, or None when it does."""
    if _THREAD.match(source):
        return None
    host = _CODE_HOST.match(source)
    if host is None:
        return None  # a page off the code hosts: its figure's date is what there is
    rest = host.group("rest")
    if source.startswith(("https://raw.githubusercontent.com", "http://raw.githubusercontent.com")):
        return None if _RAW_PINNED.match(rest) else "names a branch or tag, not a commit"
    if _PINNED_REF.match(rest):
        return None
    return (
        "names a branch or tag, not a commit"
        if rest.strip("/")
        else "names a repository, not a commit"
    )


def figure_problems(recipe: Recipe) -> Iterator[str]:
    """One line per published figure of `recipe` (default and variants) that lacks a pin."""
    blocks: list[tuple[str, Published]] = []
    if recipe.published is not None:
        blocks.append(("default", recipe.published))
    blocks += [
        (f"variant {name}", variant.published)
        for name, variant in recipe.variants.items()
        if variant.published is not None
    ]
    for where, published in blocks:
        for kind in ("decode", "prefill", "throughput"):
            figure = getattr(published, kind)
            if figure is None:
                continue
            why = unpinned_link(figure.source)
            if why is not None:
                yield (
                    f"{recipe.name} {where}: the {kind} figure's source {figure.source} {why}"
                    " (link the commit it was read at)"
                )
        if published.acceptance is not None and not _NAMES_COMMIT_OR_DATE.search(
            published.acceptance.source
        ):
            yield (
                f"{recipe.name} {where}: the acceptance figure's source names no commit or date"
                " (add the one it was read at)"
            )
