"""The loopback OpenAI-compatible replay server the tests talk to: it lives in the
library (``koi.rlm.replay_server``, also behind ``koi rlm serve-replay``); this name is
kept for the tests and scripts that import it."""

from koi.rlm.replay_server import ReplayServer, completion, load_script, tool_call

__all__ = ["ReplayServer", "completion", "load_script", "tool_call"]
