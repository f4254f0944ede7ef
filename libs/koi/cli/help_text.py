"""Help texts the terminal wraps: docstrings' hard line breaks taken out before Typer
shows them.

Typer (rich mode) keeps a docstring's single line breaks, so a command's help shows the
source file's 88-column breaks mid-sentence at any terminal width. ``reflow`` joins the
lines of each prose paragraph and leaves what is laid out on purpose: list items (one
per line, their continuation lines joined to them), indented blocks (examples) and
Click's ``\\b`` paragraphs. ``reflow_app`` applies it to every command and group of an
app, once all are registered.
"""

from __future__ import annotations

import inspect
import re

import typer

_ITEM = re.compile(r"^(?:[-*•]|\d+[.)])\s")


def reflow(text: str) -> str:
    """``text`` with each prose paragraph on one line (paragraphs stay apart)."""
    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = para.split("\n")
        if para.startswith("\b") or all(line.startswith((" ", "\t")) for line in lines):
            out.append(para)
            continue
        if any(_ITEM.match(line) for line in lines):
            items: list[str] = []
            for line in lines:
                if _ITEM.match(line) or not items:
                    items.append(line.rstrip())
                else:
                    items[-1] += " " + line.strip()
            out.append("\n".join(items))
            continue
        out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def reflow_app(app: typer.Typer) -> None:
    """Reflow the help of ``app``, its commands and its groups, recursively."""
    if isinstance(app.info.help, str):
        app.info.help = reflow(app.info.help)
    for command in app.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        if doc:
            command.help = reflow(doc)
    for group in app.registered_groups:
        if isinstance(group.help, str):
            group.help = reflow(group.help)
        if group.typer_instance is not None:
            reflow_app(group.typer_instance)
