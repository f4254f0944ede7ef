"""A known, harmless library warning is shown at debug only: asyncio's TLS eof warning
never reaches an operator's console."""

from __future__ import annotations

import logging

import pytest

from services.runtime.logs import quiet_library_noise


@pytest.mark.parametrize(("root_level", "shown"), [(logging.INFO, False), (logging.DEBUG, True)])
def test_the_asyncio_tls_eof_warning_is_debug(root_level: int, shown: bool,
                                               caplog: pytest.LogCaptureFixture) -> None:
    quiet_library_noise()
    root = logging.getLogger()
    before = root.level
    root.setLevel(root_level)
    try:
        with caplog.at_level(root_level):
            logging.getLogger("asyncio").warning(
                "returning true from eof_received() has no effect when using ssl")
            logging.getLogger("asyncio").warning("something else entirely")
    finally:
        root.setLevel(before)
    messages = [(r.levelname, r.getMessage()[:20]) for r in caplog.records]
    assert ("WARNING", "something else entir") in messages
    assert (("DEBUG", "returning true from ") in messages) == shown
    assert not any(lvl == "WARNING" and m.startswith("returning") for lvl, m in messages)
