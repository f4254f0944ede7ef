"""What vLLM and SGLang call the quantities Koi reads, release layout by release layout.

Data only. Each ``VersionTable`` is one release's layout, read from that release's own
metric definitions (the file and release are in ``source``); ``releases`` says which
releases share it and ``requires``/``excludes``/``engine_label`` how a page is matched to
it. ``PREFERENCE`` is, per engine, the names that feed each Koi quantity, best first (a
page carrying several, as vLLM 0.9–0.13 do during a rename, is read by the first).
``koi.fleet.engine_metrics`` reads pages with these tables; ``koi.fleet.exposition``
renders them. The names were read from the released wheels (PyPI) of each version; the
series Koi does not read are left out of the tables.

Two semantic differences matter to Koi and are recorded here rather than hidden:

* TPOT. vLLM's ``time_per_output_token_seconds`` (V0 and V1 up to 0.13) and
  ``inter_token_latency_seconds`` (0.10.2+) observe every inter-token interval (a
  token-weighted distribution); ``request_time_per_output_token_seconds`` (vLLM 0.11+,
  SGLang 0.5.20+) observes one mean TPOT per finished request, which is what Koi's own
  TPOT histogram holds, so it is preferred where present. SGLang's early
  ``time_per_output_token_seconds`` (0.3.6–0.4.4) observed, in 0.4.0, one value per request at
  its end and, for streamed requests, one per chunk as well.
* Finished and dropped. vLLM counts every finished request in ``request_success`` by
  ``finished_reason``; ``abort`` and ``error`` are read as dropped, the rest as finished.
  SGLang counts ``num_requests_total`` (finished) and, from 0.4.7,
  ``num_aborted_requests`` (dropped); before 0.4.2 it had no request counter and the
  finished count is the ``e2e_request_latency_seconds`` count.
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER_KEYS = ("prompt_tokens", "generation_tokens", "requests_finished",
                "requests_aborted", "preemptions")
GAUGE_KEYS = ("running", "waiting", "kv_usage")
HISTOGRAM_KEYS = ("ttft", "tpot", "e2e")
ABORT_REASONS = frozenset({"abort", "error"})


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as a release exposes it. ``name`` is the exposed name (a
    counter's with ``_total``, as on the page); ``key`` the Koi quantity it carries
    (``gen_throughput``: shown, not read)."""

    name: str
    kind: str                       # counter | gauge | histogram
    help: str
    key: str
    labels: tuple[str, ...]         # label names, without le / finished_reason
    buckets: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class VersionTable:
    key: str                        # the release it was read from: "vllm-0.11.2"
    engine: str                     # vllm | sglang
    releases: str                   # the releases whose pages match this layout
    source: str                     # repository, release and file the names come from
    families: tuple[Family, ...]
    requires: tuple[str, ...] = ()  # names a page must carry to match
    excludes: tuple[str, ...] = ()  # names it must not carry
    engine_label: bool | None = None  # vLLM: V1 series carry ``engine``, V0 ones do not
    finish_reasons: tuple[str, ...] = ()


# --- bucket bounds, as each release defines them ------------------------------------------
_V_TTFT_06 = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
              5.0, 7.5, 10.0)
_V_TTFT = (*_V_TTFT_06, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_V_TPOT_06 = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_V_TPOT = (*_V_TPOT_06, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_V_E2E_06 = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
             60.0)
_V_E2E = (*_V_E2E_06, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_S_TTFT_040 = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0)
_S_TPOT_040 = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
               0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_S_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
           100.0, 200.0, 400.0)
_S_ITL = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
          0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
_S_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
          100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0)

# --- HELP texts shared by several releases ---------------------------------------------------
_H_PROMPT = "Number of prefill tokens processed."
_H_GEN = "Number of generation tokens processed."
_H_PREEMPT = "Cumulative number of preemption from the engine."
_H_SUCCESS = "Count of successfully processed requests."
_H_TTFT = "Histogram of time to first token in seconds."
_H_TPOT = "Histogram of time per output token in seconds."
_H_ITL = "Histogram of inter-token latency in seconds."
_H_WAITING = "Number of requests waiting to be processed."
_H_RUNNING_V1 = "Number of requests in model execution batches."
_H_KV = "KV-cache usage. 1 means 100 percent usage."
_H_GPU_KV_DEPRECATED = ("GPU KV-cache usage. 1 means 100 percent usage."
                        "DEPRECATED: Use vllm:kv_cache_usage_perc instead.")
_H_REQ_TPOT = "Histogram of time_per_output_token_seconds per request."
_H_E2E_V1 = "Histogram of e2e request latency in seconds."
_H_S_E2E = "Histogram of End-to-end request latency in seconds"

_V0 = ("model_name",)
_V1 = ("model_name", "engine")


def _vllm_v1(running: str = _H_RUNNING_V1) -> tuple[Family, ...]:
    """The families every V1 release (0.8–0.34) shares, in the order it defines them."""
    return (
        Family("vllm:num_requests_running", "gauge", running, "running", _V1),
        Family("vllm:num_requests_waiting", "gauge", _H_WAITING, "waiting", _V1),
    )


def _vllm_counters(labels: tuple[str, ...]) -> tuple[Family, ...]:
    return (
        Family("vllm:num_preemptions_total", "counter", _H_PREEMPT, "preemptions", labels),
        Family("vllm:prompt_tokens_total", "counter", _H_PROMPT, "prompt_tokens", labels),
        Family("vllm:generation_tokens_total", "counter", _H_GEN, "generation_tokens",
               labels),
        Family("vllm:request_success_total", "counter", _H_SUCCESS, "requests", labels),
    )


TABLES: tuple[VersionTable, ...] = (
    VersionTable(
        key="vllm-0.34.0", engine="vllm",
        releases="vLLM 0.12.0–0.34.0 (V1; time_per_output_token_seconds hidden from 0.12, "
                 "gone by 0.34)",
        source="vllm-project/vllm v0.34.0 (PyPI wheel): vllm/v1/metrics/loggers.py, "
               "vllm/v1/metrics/buckets.py",
        families=(
            *_vllm_v1(),
            Family("vllm:kv_cache_usage_perc", "gauge", _H_KV, "kv_usage", _V1),
            *_vllm_counters(_V1),
            Family("vllm:time_to_first_token_seconds", "histogram", _H_TTFT, "ttft", _V1,
                   _V_TTFT),
            Family("vllm:inter_token_latency_seconds", "histogram", _H_ITL, "tpot", _V1,
                   _V_TPOT),
            Family("vllm:request_time_per_output_token_seconds", "histogram", _H_REQ_TPOT,
                   "tpot", _V1, _V_TPOT),
            Family("vllm:e2e_request_latency_seconds", "histogram", _H_E2E_V1, "e2e", _V1,
                   _V_E2E),
        ),
        requires=("vllm:inter_token_latency_seconds",),
        excludes=("vllm:time_per_output_token_seconds",), engine_label=True,
        finish_reasons=("stop", "length", "abort", "error", "repetition")),
    VersionTable(
        key="vllm-0.11.2", engine="vllm",
        releases="vLLM 0.10.2–0.11.x (V1; also 0.12–0.13 run with "
                 "--show-hidden-metrics-for-version)",
        source="vllm-project/vllm v0.11.2 (PyPI wheel): vllm/v1/metrics/loggers.py",
        families=(
            *_vllm_v1(),
            Family("vllm:kv_cache_usage_perc", "gauge", _H_KV, "kv_usage", _V1),
            *_vllm_counters(_V1),
            Family("vllm:time_to_first_token_seconds", "histogram", _H_TTFT, "ttft", _V1,
                   _V_TTFT),
            Family("vllm:time_per_output_token_seconds", "histogram",
                   _H_TPOT + "DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
                   "tpot", _V1, _V_TPOT),
            Family("vllm:inter_token_latency_seconds", "histogram", _H_ITL, "tpot", _V1,
                   _V_TPOT),
            Family("vllm:request_time_per_output_token_seconds", "histogram", _H_REQ_TPOT,
                   "tpot", _V1, _V_TPOT),
            Family("vllm:e2e_request_latency_seconds", "histogram", _H_E2E_V1, "e2e", _V1,
                   _V_E2E),
        ),
        requires=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        engine_label=True, finish_reasons=("stop", "length", "abort")),
    VersionTable(
        key="vllm-0.9.2", engine="vllm",
        releases="vLLM 0.8.0–0.10.1 (V1; 0.8.x has gpu_cache_usage_perc only, 0.9–0.10 "
                 "both KV names)",
        source="vllm-project/vllm v0.9.2 (PyPI wheel): vllm/v1/metrics/loggers.py",
        families=(
            *_vllm_v1(),
            Family("vllm:gpu_cache_usage_perc", "gauge", _H_GPU_KV_DEPRECATED, "kv_usage",
                   _V1),
            Family("vllm:kv_cache_usage_perc", "gauge", _H_KV, "kv_usage", _V1),
            *_vllm_counters(_V1),
            Family("vllm:time_to_first_token_seconds", "histogram", _H_TTFT, "ttft", _V1,
                   _V_TTFT),
            Family("vllm:time_per_output_token_seconds", "histogram", _H_TPOT, "tpot", _V1,
                   _V_TPOT),
            Family("vllm:e2e_request_latency_seconds", "histogram", _H_E2E_V1, "e2e", _V1,
                   _V_E2E),
        ),
        excludes=("vllm:inter_token_latency_seconds",), engine_label=True,
        finish_reasons=("stop", "length", "abort")),
    VersionTable(
        key="vllm-0.6.6", engine="vllm",
        releases="vLLM V0 engine: the default up to 0.7.x, VLLM_USE_V1=0 up to 0.10 "
                 "(bucket bounds widened to V1's in later V0 releases)",
        source="vllm-project/vllm v0.6.6.post1 (PyPI wheel): vllm/engine/metrics.py",
        families=(
            Family("vllm:num_requests_running", "gauge",
                   "Number of requests currently running on GPU.", "running", _V0),
            Family("vllm:num_requests_waiting", "gauge", _H_WAITING, "waiting", _V0),
            Family("vllm:gpu_cache_usage_perc", "gauge",
                   "GPU KV-cache usage. 1 means 100 percent usage.", "kv_usage", _V0),
            *_vllm_counters(_V0),
            Family("vllm:time_to_first_token_seconds", "histogram", _H_TTFT, "ttft", _V0,
                   _V_TTFT_06),
            Family("vllm:time_per_output_token_seconds", "histogram", _H_TPOT, "tpot", _V0,
                   _V_TPOT_06),
            Family("vllm:e2e_request_latency_seconds", "histogram",
                   "Histogram of end to end request latency in seconds.", "e2e", _V0,
                   _V_E2E_06),
        ),
        engine_label=False, finish_reasons=("stop", "length", "abort")),
    VersionTable(
        key="sglang-0.5.23", engine="sglang",
        releases="SGLang 0.5.20–0.5.23 (per-request TPOT; is_streaming label from 0.5.19)",
        source="sgl-project/sglang v0.5.23 (PyPI wheel): "
               "python/sglang/srt/observability/metrics_collector.py",
        families=(
            Family("sglang:num_running_reqs", "gauge", "The number of running requests.",
                   "running", ("model_name", "engine_type", "tp_rank", "pp_rank",
                               "moe_ep_rank")),
            Family("sglang:num_queue_reqs", "gauge",
                   "The number of requests in the waiting queue.", "waiting",
                   ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")),
            Family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
                   "gen_throughput", ("model_name", "engine_type", "tp_rank", "pp_rank",
                                      "moe_ep_rank")),
            Family("sglang:token_usage", "gauge", "The token usage.", "kv_usage",
                   ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")),
            Family("sglang:num_retracted_requests_total", "counter",
                   "Total number of retracted requests.", "preemptions",
                   ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")),
            Family("sglang:prompt_tokens_total", "counter", _H_PROMPT, "prompt_tokens",
                   ("model_name", "engine_type", "is_streaming")),
            Family("sglang:generation_tokens_total", "counter", _H_GEN, "generation_tokens",
                   ("model_name", "engine_type", "is_streaming")),
            Family("sglang:num_requests_total", "counter", "Number of requests processed.",
                   "requests_finished", ("model_name", "engine_type", "is_streaming")),
            Family("sglang:num_aborted_requests_total", "counter",
                   "Number of requests aborted.", "requests_aborted",
                   ("model_name", "engine_type")),
            Family("sglang:time_to_first_token_seconds", "histogram", _H_TTFT, "ttft",
                   ("model_name", "engine_type", "is_streaming"), _S_TTFT),
            Family("sglang:inter_token_latency_seconds", "histogram", _H_ITL, "tpot",
                   ("model_name", "engine_type"), _S_ITL),
            Family("sglang:request_time_per_output_token_seconds", "histogram",
                   "Per-request TPOT in seconds: (finished_time - first_token_time) / "
                   "(completion_tokens - 1).", "tpot",
                   ("model_name", "engine_type", "is_streaming"), _S_ITL),
            Family("sglang:e2e_request_latency_seconds", "histogram", _H_S_E2E, "e2e",
                   ("model_name", "engine_type", "is_streaming"), _S_E2E),
        ),
        requires=("sglang:request_time_per_output_token_seconds",)),
    VersionTable(
        key="sglang-0.5.2", engine="sglang",
        releases="SGLang 0.4.4–0.5.19 (inter_token_latency_seconds; num_aborted_requests "
                 "from 0.4.7, total_retracted_reqs from a 0.4.9 post-release; bounds of 0.4.5+)",
        source="sgl-project/sglang v0.5.2 (PyPI wheel): python/sglang/srt/metrics/"
               "collector.py, python/sglang/srt/managers/scheduler_metrics_mixin.py",
        families=(
            Family("sglang:num_running_reqs", "gauge", "The number of running requests.",
                   "running", ("model_name", "engine_type", "tp_rank", "pp_rank")),
            Family("sglang:token_usage", "gauge", "The token usage.", "kv_usage",
                   ("model_name", "engine_type", "tp_rank", "pp_rank")),
            Family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
                   "gen_throughput", ("model_name", "engine_type", "tp_rank", "pp_rank")),
            Family("sglang:num_queue_reqs", "gauge",
                   "The number of requests in the waiting queue.", "waiting",
                   ("model_name", "engine_type", "tp_rank", "pp_rank")),
            Family("sglang:total_retracted_reqs", "gauge",
                   "The total number of retracted requests due to kvcache full.",
                   "preemptions", ("model_name", "engine_type", "tp_rank", "pp_rank")),
            Family("sglang:prompt_tokens_total", "counter", _H_PROMPT, "prompt_tokens",
                   ("model_name",)),
            Family("sglang:generation_tokens_total", "counter", _H_GEN, "generation_tokens",
                   ("model_name",)),
            Family("sglang:num_requests_total", "counter", "Number of requests processed.",
                   "requests_finished", ("model_name",)),
            Family("sglang:num_aborted_requests_total", "counter",
                   "Number of requests aborted.", "requests_aborted", ("model_name",)),
            Family("sglang:time_to_first_token_seconds", "histogram", _H_TTFT, "ttft",
                   ("model_name",), _S_TTFT),
            Family("sglang:inter_token_latency_seconds", "histogram", _H_ITL, "tpot",
                   ("model_name",), _S_ITL),
            Family("sglang:e2e_request_latency_seconds", "histogram", _H_S_E2E, "e2e",
                   ("model_name",), _S_E2E),
        ),
        requires=("sglang:inter_token_latency_seconds",)),
    VersionTable(
        key="sglang-0.4.0", engine="sglang",
        releases="SGLang 0.3.6–0.4.3 (time_per_output_token_seconds; num_requests_total "
                 "from 0.4.2; these bucket bounds up to 0.4.1)",
        source="sgl-project/sglang v0.4.0 (PyPI wheel): python/sglang/srt/metrics/"
               "collector.py (0.3.6 defines the same)",
        families=(
            Family("sglang:num_running_reqs", "gauge", "The number of running requests",
                   "running", ("model_name",)),
            Family("sglang:token_usage", "gauge", "The token usage", "kv_usage",
                   ("model_name",)),
            Family("sglang:gen_throughput", "gauge", "The generate throughput (token/s)",
                   "gen_throughput", ("model_name",)),
            Family("sglang:num_queue_reqs", "gauge",
                   "The number of requests in the waiting queue", "waiting",
                   ("model_name",)),
            Family("sglang:prompt_tokens_total", "counter", _H_PROMPT, "prompt_tokens",
                   ("model_name",)),
            Family("sglang:generation_tokens_total", "counter", _H_GEN, "generation_tokens",
                   ("model_name",)),
            Family("sglang:time_to_first_token_seconds", "histogram", _H_TTFT, "ttft",
                   ("model_name",), _S_TTFT_040),
            Family("sglang:time_per_output_token_seconds", "histogram", _H_TPOT, "tpot",
                   ("model_name",), _S_TPOT_040),
            Family("sglang:e2e_request_latency_seconds", "histogram", _H_S_E2E, "e2e",
                   ("model_name",), _V_E2E_06),
        )),
)
"""Most specific first: ``detect`` takes the first table a page matches."""

PREFERENCE: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        "requests_finished": ("vllm:request_success_total",),
        "requests_aborted": ("vllm:request_success_total",),
        "preemptions": ("vllm:num_preemptions_total",),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "ttft": ("vllm:time_to_first_token_seconds",),
        "tpot": ("vllm:request_time_per_output_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "e2e": ("vllm:e2e_request_latency_seconds",),
    },
    "sglang": {
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
        "requests_finished": ("sglang:num_requests_total",),
        "requests_aborted": ("sglang:num_aborted_requests_total",),
        # a counter from 0.5.x; before it, a gauge holding the running total
        "preemptions": ("sglang:num_retracted_requests_total", "sglang:total_retracted_reqs"),
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
        "ttft": ("sglang:time_to_first_token_seconds",),
        "tpot": ("sglang:request_time_per_output_token_seconds",
                 "sglang:time_per_output_token_seconds", "sglang:inter_token_latency_seconds"),
        "e2e": ("sglang:e2e_request_latency_seconds",),
    },
}


def table(key: str) -> VersionTable:
    """The layout with this key (``vllm-0.11.2``…); ``KeyError`` names the known ones."""
    for t in TABLES:
        if t.key == key:
            return t
    raise KeyError(f"no metrics table {key!r}; known: {', '.join(t.key for t in TABLES)}")
