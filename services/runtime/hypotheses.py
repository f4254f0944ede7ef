"""Following the hypothesis rounds on the bus (``koi.tick.*.hypotheses``).

``HypothesisFeed`` reads every ``HypothesisRound`` the tick stream holds, from its start
(so a restarted process knows the hypotheses still in force) and then as they are
published, into a ``koi.rlm.loop.HypothesisLoop``: the proposer takes its extra
candidates from it, the causal store its weak priors. A message that does not decode is
skipped with a warning (the proposer that published it checked it). ``seen`` says
whether any round was ever read: without the language-model layer there is none, and
the readers change nothing.
"""

from __future__ import annotations

from typing import Any

import structlog

from koi import subjects
from koi.catalog import Catalog
from koi.rlm.loop import HypothesisLoop
from koi.rlm.settings import RlmSettings
from koi.wire.hypotheses import decode_hypotheses
from services.runtime.bus import Bus

log = structlog.get_logger(__name__)


class HypothesisFeed:
    """The rounds on the bus, folded into a ``HypothesisLoop`` (``loop``)."""

    def __init__(self, bus: Bus, catalog: Catalog, settings: RlmSettings | None = None) -> None:
        self.bus, self.catalog = bus, catalog
        self.loop = HypothesisLoop(settings or RlmSettings.model_validate({}))
        self.seen = False
        self._sub: Any = None

    async def start(self) -> HypothesisFeed:
        self._sub = await self.bus.js.subscribe(subjects.tick_filter(subjects.HYPOTHESES),
                                                ordered_consumer=True, cb=self._on_msg)
        return self

    async def _on_msg(self, msg: Any) -> None:
        try:
            outcome = decode_hypotheses(await self.bus.resolve(msg), catalog=self.catalog)
        except Exception as exc:
            log.warning("hypotheses_skipped", subject=msg.subject, error=repr(exc)[:300])
            return
        self.seen = True
        self.loop.adopt(outcome)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
