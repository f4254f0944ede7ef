"""Kubernetes names, label keys and label values for Koi's objects.

Job and deployment ids come from outside (a job spec, a planner over the bus) and are
treated as untrusted text: they never reach a manifest except through ``label_value``
and ``object_name`` (Kubernetes' own character rules, length cut, plus a hash), or as
annotation values (free text to the API; the JSON serializer escapes it, and nothing
is ever spliced into YAML or a shell line). The raw ids travel in annotations so the
mapping back from what runs to Koi's ids is exact.

Pure string handling: no I/O, no kubernetes client imports.
"""

from __future__ import annotations

import hashlib
import re

GROUP = "koi.dev"
LABEL_JOB = f"{GROUP}/job"
LABEL_DEPLOYMENT = f"{GROUP}/deployment"
LABEL_CONFIG_HASH = f"{GROUP}/config-hash"
LABEL_PLAN_TICK = f"{GROUP}/plan-tick"
LABEL_SERVING = f"{GROUP}/serving"        # "true" on pods that answer HTTP (not LWS workers)
LABEL_CAPACITY = f"{GROUP}/capacity-type"  # node label: spot | on-demand | reserved
LABEL_ACCELERATOR = f"{GROUP}/accelerator"  # node label: a Koi catalog accelerator id
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "koi"
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

# raw ids and state, as annotations (any text is a valid annotation value)
ANN_JOB_ID = f"{GROUP}/job-id"
ANN_DEPLOYMENT_ID = f"{GROUP}/deployment-id"
ANN_OFFERING = f"{GROUP}/offering"
ANN_CONFIG = f"{GROUP}/config"            # the DeploymentConfig as canonical JSON
ANN_REPLACES = f"{GROUP}/replaces"        # "<Kind>/<name>" this object makes way for
ANN_STATE = f"{GROUP}/state"              # "draining" once drained
ANN_REASON = f"{GROUP}/reason"            # the planner's reason, cut to REASON_CHARS
STATE_DRAINING = "draining"
REASON_CHARS = 1024

# Kubernetes limits (apimachinery/pkg/util/validation): a label value is at most 63
# characters of [A-Za-z0-9._-], starting and ending alphanumeric; a DNS-1123 label is at
# most 63 of [a-z0-9-], starting and ending alphanumeric. Object names are kept shorter:
# LeaderWorkerSet derives StatefulSet and pod names and a controller-revision-hash label
# from its own name, and Deployment names prefix their ReplicaSets' and pods' names.
LABEL_VALUE_MAX = 63
NAME_MAX = 45
HASH_CHARS = 10
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# the suffix a hashed value ends with: a valid id that happens to end like this is
# hashed too, so a crafted id can never land on the value another id was hashed to
_HASHED_SUFFIX = re.compile(rf"-h[0-9a-f]{{{HASH_CHARS}}}$")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]


def is_label_value(value: str) -> bool:
    return len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(value) is not None


def is_dns_label(value: str) -> bool:
    return len(value) <= LABEL_VALUE_MAX and _DNS_LABEL.fullmatch(value) is not None


def label_value(raw: str) -> str:
    """A valid label value standing for ``raw``: ``raw`` itself when it already is one
    (and does not end like a hashed value), else its sanitized prefix plus ``-h`` and a
    hash of the whole of it. Distinct inputs give distinct outputs (up to the hash)."""
    if raw and is_label_value(raw) and not _HASHED_SUFFIX.search(raw):
        return raw
    return _hashed(re.sub(r"[^A-Za-z0-9._-]+", "-", raw), raw, LABEL_VALUE_MAX,
                   strip="-_.")


def object_name(raw: str, prefix: str = "koi-") -> str:
    """A DNS-1123 label of at most ``NAME_MAX`` characters for an object standing for
    ``raw`` (a deployment or job id): ``prefix + raw`` when that is one already, else
    the lower-cased, sanitized prefix plus ``-h`` and a hash of ``raw``. The prefix makes
    it start with a letter, which Service names (DNS-1035) need."""
    name = prefix + raw
    if raw and len(name) <= NAME_MAX and _DNS_LABEL.fullmatch(name) \
            and not _HASHED_SUFFIX.search(name):
        return name
    cleaned = prefix + re.sub(r"[^a-z0-9-]+", "-", raw.lower())
    return _hashed(cleaned, raw, NAME_MAX, strip="-")


def _hashed(cleaned: str, raw: str, limit: int, strip: str) -> str:
    suffix = f"-h{_digest(raw)}"
    head = cleaned[:limit - len(suffix)].strip(strip)
    return f"{head}{suffix}" if head else suffix[1:]


def short_text(raw: str, limit: int = REASON_CHARS) -> str:
    """An annotation-sized piece of free text (annotations hold any text, but not
    without end: the API caps all of an object's annotations at 256 KiB together)."""
    return raw if len(raw) <= limit else raw[:limit - 1] + "…"
