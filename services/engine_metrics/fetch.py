"""engine-metrics' HTTP: bounded GETs with the standard library, run in worker threads.

Every read has a total deadline (not only a per-socket-operation timeout, so a server
that drips bytes cannot hold a worker), a size limit, no proxy from the environment
(``http_proxy`` must not reroute a scrape) and no redirects (a target is read where the
targets list says it is). Errors come back as ``FetchError`` with one line saying why;
URLs in messages lose any ``user:password@``.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request

from koi.fleet.engine_metrics import MAX_PAGE_BYTES, EngineScrape, MetricsPageError, parse_page
from koi.safe_text import printable
from services.runtime.settings import redact_url

MAX_TARGETS_BYTES = 8 * 1024 * 1024
MAX_ANSWER_BYTES = 16 * 1024 * 1024
_CHUNK = 64 * 1024
_HEADERS = {"User-Agent": "koi-engine-metrics",
            "Accept": "text/plain;version=0.0.4;q=1.0, application/json;q=0.9, */*;q=0.1"}


class FetchError(Exception):
    """A read that failed: unreachable, not 200, too slow or too large."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect refused ({code})",
                                     headers, fp)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def get(url: str, *, timeout_s: float, max_bytes: int) -> bytes:
    """The body of ``GET url`` (200 only), within ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    where = redact_url(url)
    try:
        with _OPENER.open(urllib.request.Request(url, headers=_HEADERS),
                          timeout=timeout_s) as resp:
            if resp.status != 200:
                raise FetchError(f"{where}: HTTP {resp.status}")
            length = resp.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise FetchError(f"{where}: {length} bytes, over the {max_bytes} limit")
            chunks, size = [], 0
            while chunk := resp.read1(_CHUNK):  # what has come, not a full chunk
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError(f"{where}: over the {max_bytes}-byte limit")
                if time.monotonic() > deadline:
                    raise FetchError(f"{where}: not read within {timeout_s:g} s")
                chunks.append(chunk)
            return b"".join(chunks)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{where}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise FetchError(f"{where}: {printable(f'{type(e).__name__}: {reason}', 200)}") \
            from None


def scrape(url: str, *, timeout_s: float) -> EngineScrape | str:
    """One replica's page read and parsed, or why it could not be (one line)."""
    try:
        return parse_page(get(url, timeout_s=timeout_s, max_bytes=MAX_PAGE_BYTES))
    except FetchError as e:
        return str(e)
    except MetricsPageError as e:
        return f"{redact_url(url)}: {printable(str(e), 200)}"
    except Exception as e:  # no page may hold the tick (or the consumer) up
        return f"{redact_url(url)}: unreadable ({type(e).__name__})"


def query(base_url: str, promql: str, *, at: float, timeout_s: float) -> object:
    """A Prometheus instant query (``/api/v1/query`` at Unix time ``at``), its JSON
    answer parsed; ``FetchError`` if it could not be read (a refused query is HTTP 400
    or 422)."""
    params = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
    url = f"{base_url.rstrip('/')}/api/v1/query?{params}"
    body = get(url, timeout_s=timeout_s, max_bytes=MAX_ANSWER_BYTES)
    try:
        return json.loads(body)
    except ValueError:
        raise FetchError(f"{redact_url(base_url)}: the answer is not JSON") from None
