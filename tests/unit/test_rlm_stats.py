"""``koi rlm stats``' arithmetic: a round's figures from its transcript, and the sums."""

from __future__ import annotations

from koi.rlm.stats import round_row, summary
from koi.rlm.transcript import Transcript


def transcript(ok: bool, accepted: int, reasons: list[str], tokens=(900, 200),
               seconds: float = 20.0) -> Transcript:
    t = Transcript()
    t.add("round_start", round_id="r5-x", tick=5, model="small")
    t.add("round_end", ok=ok, reason="" if ok else "timeout after 150.0s",
          accepted=[f"h{i}" for i in range(accepted)],
          dropped=[{"index": i, "reason": r} for i, r in enumerate(reasons)],
          spend={"prompt_tokens": tokens[0], "completion_tokens": tokens[1],
                 "seconds": seconds, "calls": 1})
    return t


def test_a_rounds_row_and_the_summary_count_validity_over_all_rounds() -> None:
    rows = [round_row(transcript(True, 1, ["direction increase contradicts size ×0.5"])),
            round_row(transcript(True, 0, ["direction decrease contradicts size ×1.4",
                                           "size must lie within [size_low, size_high]"],
                                 tokens=(1100, 300), seconds=30.0)),
            round_row(transcript(False, 0, [], tokens=(0, 0), seconds=150.0))]
    assert None not in rows
    first = rows[0]
    assert (first.proposed, first.accepted, first.decode_tok_s) == (2, 1, 10.0)
    total = summary(rows)  # type: ignore[arg-type]
    assert (total["rounds"], total["ok"], total["failed"]) == (3, 2, 1)
    assert (total["proposed"], total["accepted"]) == (4, 1) and total["validity"] == 0.25
    assert total["mean_prompt_tokens"] == 1000 and total["mean_seconds"] == 25.0
    assert total["drop_reasons"] == {"direction increase contradicts size": 1,
                                     "direction decrease contradicts size": 1,
                                     "size must lie within [size_low, size_high]": 1}
    assert total["failures"] == {"timeout after 150.0s": 1}


def test_a_round_that_never_ended_has_no_row() -> None:
    t = Transcript()
    t.add("round_start", round_id="r1", tick=1, model="m")
    assert round_row(t) is None and summary([])["validity"] is None
