"""Help texts are wrapped by the terminal, not by the docstring's line breaks."""

from __future__ import annotations

from typer.testing import CliRunner

from koi.cli.help_text import reflow


def test_prose_paragraphs_are_joined_and_kept_apart() -> None:
    doc = """First line of a sentence
    that goes on here.

    Second paragraph,
    also joined."""
    assert reflow(doc) == ("First line of a sentence that goes on here.\n\n"
                           "Second paragraph, also joined.")


def test_list_items_stay_one_per_line_with_their_continuations() -> None:
    doc = "Steps:\n\n- one item\n  that wraps\n- two\n1. three"
    assert reflow(doc) == "Steps:\n\n- one item that wraps\n- two\n1. three"


def test_indented_blocks_and_click_b_paragraphs_are_kept() -> None:
    doc = "Example:\n\n    koi bench --policy koi\n    koi bench report out\n\n\bkept\nas is"
    assert reflow(doc) == doc


def test_koi_help_shows_no_docstring_break_mid_sentence() -> None:
    from services.koi_command import app

    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "240"}).output
    assert "(without --concurrency/--rate: the offline, as-many-as-fit throughput)" in out
