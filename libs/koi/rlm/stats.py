"""What recorded rounds cost and how often their hypotheses held: per round and in all.

``round_row(transcript)`` reads one round's transcript (its ``round_start`` and
``round_end`` records, as ``koi-rlm`` and the proposer write them) into a ``RoundRow``:
model, tick, ok or the reason it failed, tokens in and out, model seconds, calls,
hypotheses proposed and accepted (and how many accepted ones only repeat the compact
prompt's worked example), and the reasons of the dropped ones. ``summary(rows)``
adds them up: rounds, failures, the validity rate (accepted / proposed, over all
rounds), mean tokens and seconds, and the drop reasons by how often they came. Behind
``koi rlm stats``. Pure: the caller reads the files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from koi.rlm.compact import EXAMPLE_ANSWER
from koi.rlm.transcript import Transcript

EXAMPLE_STATEMENT = EXAMPLE_ANSWER["hypotheses"][0]["statement"]


@dataclass(frozen=True)
class RoundRow:
    round_id: str
    model: str
    tick: int
    ok: bool
    reason: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    calls: int
    proposed: int
    accepted: int
    drop_reasons: tuple[str, ...]
    copies: int = 0   # accepted ones that repeat the compact prompt's worked example

    @property
    def decode_tok_s(self) -> float | None:
        """Completion tokens per model second (prefill included: a floor on decode)."""
        return self.completion_tokens / self.seconds if self.seconds > 0 else None


def round_row(transcript: Transcript) -> RoundRow | None:
    """The round's figures (None when the transcript has no ``round_end``)."""
    starts, ends = transcript.of_kind("round_start"), transcript.of_kind("round_end")
    if not ends:
        return None
    start: dict[str, Any] = starts[0] if starts else {}
    end = ends[-1]
    spend = end.get("spend") or {}
    dropped = end.get("dropped") or []
    accepted = len(end.get("accepted") or [])
    return RoundRow(
        round_id=str(start.get("round_id", "?")), model=str(start.get("model", "?")),
        tick=int(start.get("tick", -1)), ok=bool(end.get("ok")),
        reason=str(end.get("reason", "")),
        prompt_tokens=int(spend.get("prompt_tokens", 0)),
        completion_tokens=int(spend.get("completion_tokens", 0)),
        seconds=float(spend.get("seconds", 0.0)), calls=int(spend.get("calls", 0)),
        proposed=accepted + len(dropped), accepted=accepted,
        drop_reasons=tuple(str(d.get("reason", "")) for d in dropped),
        copies=sum(1 for h in end.get("hypotheses") or []
                   if isinstance(h, dict) and h.get("statement") == EXAMPLE_STATEMENT))


def _reason_kind(reason: str) -> str:
    """A drop reason without its particulars (the first problem, before any quote)."""
    first = reason.split(";")[0]
    return first.split("'")[0].split("×")[0].strip()[:80]


def summary(rows: Sequence[RoundRow]) -> dict[str, Any]:
    n = len(rows)
    proposed = sum(r.proposed for r in rows)
    accepted = sum(r.accepted for r in rows)
    ok = [r for r in rows if r.ok]
    reasons = Counter(_reason_kind(x) for r in rows for x in r.drop_reasons)
    failures = Counter(r.reason for r in rows if not r.ok)

    def mean(values: Sequence[float]) -> float | None:
        return sum(values) / len(values) if values else None

    return {"rounds": n, "ok": len(ok), "failed": n - len(ok),
            "failures": dict(failures.most_common()),
            "proposed": proposed, "accepted": accepted,
            "validity": accepted / proposed if proposed else None,
            "rounds_with_a_valid_hypothesis": sum(1 for r in rows if r.accepted),
            "accepted_copies_of_the_example": sum(r.copies for r in rows),
            "mean_prompt_tokens": mean([r.prompt_tokens for r in ok]),
            "mean_completion_tokens": mean([r.completion_tokens for r in ok]),
            "mean_seconds": mean([r.seconds for r in ok]),
            "max_seconds": max((r.seconds for r in ok), default=None),
            "drop_reasons": dict(reasons.most_common())}
