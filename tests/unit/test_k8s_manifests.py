"""Koi deployments as Kubernetes manifests (``koi.fleet.k8s.manifests`` / ``engines``).

Every engine on every vendor the catalog lets it run on renders a manifest that is
valid against the stored Kubernetes schema subset (tests/data/k8s); the engine knobs
become the engine's real flags (and agree with the catalog's knob table); hostile job
and deployment ids cannot break or inject into a manifest; multi-node replicas become
LeaderWorkerSets; labels, selectors, node placement and tolerations are what
docs/FLEETS.md says. Pure: no API server.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from koi.catalog import Market, Offering, load_catalog
from koi.fleet.k8s import names as N
from koi.fleet.k8s.engines import (
    IMAGES,
    TRTLLM_OPTIONS_ENV,
    TRTLLM_WRAPPER,
    ManifestError,
)
from koi.fleet.k8s.manifests import (
    GPU_RESOURCE,
    KIND_DEPLOYMENT,
    KIND_LWS,
    ManifestOptions,
    Workload,
    render,
    render_service,
)
from koi.space import DeploymentConfig, config_hash, engine_default_config
from support.k8s_schema import validate

CAT = load_catalog()
OPTS = ManifestOptions()
DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def offering(accel: str, cloud: str = "aws", market: Market = Market.ON_DEMAND,
             region: str = "us-east-1") -> Offering:
    return Offering(f"{cloud}/{region}/{accel}/{market.value}", cloud, region, accel, market,
                    1.0, 8, 0.0, 0.0)


def workload(cfg: DeploymentConfig, off: Offering | None = None, *, job: str = "chat",
             dep: str = "chat-d1", replicas: int = 2, tick: int = 7, **kw) -> Workload:
    return Workload(job, dep, cfg, off or offering(cfg.accelerator), replicas, tick,
                    "because", **kw)


def container(body: dict, template: str = "") -> dict:
    spec = body["spec"]
    tmpl = spec["leaderWorkerTemplate"][template] if template else spec["template"]
    return tmpl["spec"]["containers"][0]


def flags(c: dict) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# --- every engine, every vendor -------------------------------------------------------

ENGINE_VENDORS = [(e.id, v) for e in CAT.engines.values() for v in e.accelerator_vendors]
VENDOR_ACCEL = {"nvidia": "h100-sxm", "amd": "mi300x", "intel": "gaudi2"}


@pytest.mark.parametrize(("engine", "vendor"), ENGINE_VENDORS)
def test_every_engine_and_vendor_renders_a_schema_valid_deployment(engine, vendor):
    accel = VENDOR_ACCEL[vendor]
    cfg = engine_default_config("llama-3.1-8b", accel, engine, catalog=CAT)
    r = render(workload(cfg), CAT, OPTS)
    assert r.kind == KIND_DEPLOYMENT
    assert validate(r.body) == []
    c = container(r.body)
    assert c["image"] == IMAGES[(engine, vendor)]
    assert c["resources"]["limits"] == {GPU_RESOURCE[vendor]: "1"}
    probe = c["readinessProbe"]["httpGet"]
    assert probe == {"path": "/health", "port": "http"}
    assert c["ports"][0]["name"] == "http"
    entry = " ".join(flags(c))
    assert {"vllm": "vllm serve", "sglang": "sglang.launch_server",
            "trtllm": "trtllm-serve"}[engine] in entry
    # the round trip through YAML gives back the same object
    assert yaml.safe_load(yaml.safe_dump(r.body)) == r.body


def test_gpu_resource_names_by_vendor():
    assert GPU_RESOURCE == {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu",
                            "intel": "habana.ai/gaudi"}


def test_a_vendor_without_an_image_for_the_engine_is_refused():
    cfg = engine_default_config("llama-3.1-8b", "gaudi2", "sglang", catalog=CAT)
    with pytest.raises(ManifestError, match="no sglang image for intel"):
        render(workload(cfg), CAT, OPTS)


# --- the knobs as flags ---------------------------------------------------------------

def test_vllm_flags_carry_every_knob():
    cfg = engine_default_config(
        "qwen3-30b-a3b", "h100-sxm", "vllm", catalog=CAT, tp=2, dp_attention=2, ep=4,
        max_num_seqs=128, max_batched_tokens=4096, gpu_mem_fraction=0.85, kv_dtype="fp8",
        prefix_caching=False, chunked_prefill=False, cuda_graphs=False, max_model_len=8192,
        block_size=32, spec_decode="ngram", spec_tokens=3, weight_precision="fp8",
        custom_allreduce=False)
    args = container(render(workload(cfg), CAT, OPTS).body)["args"]
    assert args[0] == "Qwen/Qwen3-30B-A3B"
    expect = {"--tensor-parallel-size": "2", "--pipeline-parallel-size": "1",
              "--data-parallel-size": "2", "--max-num-seqs": "128",
              "--max-num-batched-tokens": "4096", "--gpu-memory-utilization": "0.85",
              "--kv-cache-dtype": "fp8", "--max-model-len": "8192", "--block-size": "32",
              "--quantization": "fp8", "--served-model-name": "qwen3-30b-a3b"}
    for flag, value in expect.items():
        assert flag_value(args, flag) == value, flag
    for flag in ("--enable-expert-parallel", "--no-enable-prefix-caching",
                 "--no-enable-chunked-prefill", "--enforce-eager",
                 "--disable-custom-all-reduce"):
        assert flag in args
    spec = json.loads(flag_value(args, "--speculative-config"))
    assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def test_vllm_defaults_turn_features_on_and_bf16_sets_the_dtype():
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)
    args = container(render(workload(cfg), CAT, OPTS).body)["args"]
    assert "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert "--enforce-eager" not in args and "--quantization" not in args
    assert flag_value(args, "--dtype") == "bfloat16"
    assert flag_value(args, "--kv-cache-dtype") == "auto"


def test_sglang_flags_carry_every_knob():
    cfg = engine_default_config(
        "qwen3-30b-a3b", "h100-sxm", "sglang", catalog=CAT, tp=2, dp_attention=2, ep=4,
        max_num_seqs=96, gpu_mem_fraction=0.8, kv_dtype="fp8", prefix_caching=False,
        cuda_graphs=False, chunked_prefill=False, max_batched_tokens=40960,
        max_model_len=32768, block_size=64)
    args = container(render(workload(cfg), CAT, OPTS).body)["args"]
    expect = {"--model-path": "Qwen/Qwen3-30B-A3B", "--tp-size": "4", "--dp-size": "2",
              "--ep-size": "4", "--pp-size": "1", "--mem-fraction-static": "0.8",
              "--max-running-requests": "96", "--kv-cache-dtype": "fp8_e4m3",
              "--chunked-prefill-size": "-1", "--max-prefill-tokens": "40960",
              "--context-length": "32768", "--page-size": "64", "--port": "30000"}
    for flag, value in expect.items():
        assert flag_value(args, flag) == value, flag
    # --enable-metrics: SGLang serves /metrics only when asked (engine-metrics reads it)
    for flag in ("--enable-dp-attention", "--disable-radix-cache", "--disable-cuda-graph",
                 "--enable-metrics"):
        assert flag in args


def test_trtllm_flags_and_extra_options_file():
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "trtllm", catalog=CAT, tp=2,
                                chunked_prefill=True, prefix_caching=False,
                                cuda_graphs=False, kv_dtype="fp8")
    c = container(render(workload(cfg), CAT, OPTS).body)
    args = c["args"]
    assert c["command"][:2] == ["sh", "-c"] and "trtllm-serve \"$@\"" in c["command"][2]
    assert flag_value(args, "--tp_size") == "2"
    assert flag_value(args, "--backend") == "pytorch"
    assert "--enable_chunked_prefill" in args
    env = {e["name"]: e for e in c["env"]}
    options = yaml.safe_load(env[TRTLLM_OPTIONS_ENV]["value"])
    assert options["kv_cache_config"] == {"enable_block_reuse": False, "dtype": "fp8"}
    assert options["cuda_graph_config"] is None
    assert options["enable_attention_dp"] is False
    # the shell program is a constant: no knob or id is spliced into it
    assert c["command"][2] == TRTLLM_WRAPPER


KITCHEN_SINKS = {
    "vllm": [dict(tp=2, dp_attention=2, ep=4, pp=2, spec_decode="ngram", spec_tokens=2,
                  cuda_graphs=False, kv_dtype="fp8"),
             dict(tp=2, prefix_caching=True, chunked_prefill=True)],
    "sglang": [dict(tp=2, dp_attention=2, ep=4, pp=2, spec_decode="ngram", spec_tokens=2,
                    cuda_graphs=False, prefix_caching=False, kv_dtype="fp8")],
    "trtllm": [dict(tp=2, dp_attention=2, ep=4, pp=2, spec_decode="ngram", spec_tokens=2,
                    cuda_graphs=False, chunked_prefill=True, kv_dtype="fp8")],
}


@pytest.mark.parametrize("engine", sorted(KITCHEN_SINKS))
def test_the_catalog_knob_table_names_the_flags_we_write(engine):
    """catalog/data/engines.yaml says which flag each knob maps to; the manifests use
    exactly those (so the two tables cannot drift apart)."""
    written: set[str] = set()
    options: dict = {}
    for knobs in KITCHEN_SINKS[engine]:
        cfg = engine_default_config("qwen3-30b-a3b", "h200", engine, catalog=CAT, **knobs)
        c = container(render(workload(cfg, replicas=1), CAT, OPTS).body)
        written |= set(flags(c))
        for e in c.get("env", []):
            if e["name"] == TRTLLM_OPTIONS_ENV:
                options.update(yaml.safe_load(e["value"]))
    for knob, flag in CAT.engine(engine).knobs.items():
        name = flag.split()[0]
        if name.startswith("yaml:"):
            head, *rest = name.removeprefix("yaml:").split(".")
            assert head in options, (knob, name)
            if rest:
                assert rest[0] in options[head], (knob, name)
        else:
            assert name in written, (knob, name)


def test_quantized_weights_need_a_checkpoint():
    cfg = engine_default_config("llama-3.1-70b", "h100-sxm", "vllm", catalog=CAT, tp=1,
                                weight_precision="int4")
    with pytest.raises(ManifestError, match=r"checkpoints\['llama-3.1-70b/int4'\]"):
        render(workload(cfg), CAT, OPTS)
    opts = ManifestOptions(checkpoints={"llama-3.1-70b/int4": "org/llama-70b-awq"})
    args = container(render(workload(cfg), CAT, opts).body)["args"]
    assert args[0] == "org/llama-70b-awq" and "--quantization" not in args
    fp8 = engine_default_config("llama-3.1-70b", "h100-sxm", "trtllm", catalog=CAT, tp=2,
                                weight_precision="fp8")
    with pytest.raises(ManifestError, match="pre-quantized"):
        render(workload(fp8), CAT, OPTS)


def test_eagle_needs_a_draft_model_and_uses_it():
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "sglang", catalog=CAT,
                                spec_decode="eagle", spec_tokens=4)
    with pytest.raises(ManifestError, match="draft model"):
        render(workload(cfg), CAT, OPTS)
    opts = ManifestOptions(draft_models={"llama-3.1-8b": "org/eagle-8b"})
    args = container(render(workload(cfg), CAT, opts).body)["args"]
    assert flag_value(args, "--speculative-algorithm") == "EAGLE"
    assert flag_value(args, "--speculative-draft-model-path") == "org/eagle-8b"


def test_disaggregated_prefill_and_a_wrong_offering_are_refused():
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT,
                                pd_disaggregation=True, prefill_replicas=1)
    with pytest.raises(ManifestError, match="disaggregation"):
        render(workload(cfg), CAT, OPTS)
    plain = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)
    with pytest.raises(ManifestError, match="sells"):
        render(workload(plain, offering("a100-80gb")), CAT, OPTS)


# --- hostile ids ----------------------------------------------------------------------

HOSTILE = [
    "chat\nkind: Secret\nmetadata:\n  name: pwned",
    "x\"; rm -rf / #$(reboot)`id`",
    "UPPER_case.with.dots",
    "ünïcödé-🙂-\u202e-bidi",
    "a" * 500,
    "",
    "-leading-and-trailing-",
    "foo-h0123456789",               # looks like a hashed value: must be hashed itself
    "\x1b[31mred\x00nul",
]


@pytest.mark.parametrize("job", HOSTILE)
def test_hostile_ids_give_valid_uninjected_manifests(job):
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)
    r = render(workload(cfg, job=job, dep=job + "-d1"), CAT, OPTS)
    svc = render_service(job, OPTS)
    for body in (r.body, svc.body):
        assert validate(body) == []
        meta = body["metadata"]
        assert DNS1123.fullmatch(meta["name"]) and len(meta["name"]) <= N.NAME_MAX
        assert meta["name"].startswith("koi-")
        for key, value in meta["labels"].items():
            assert N.is_label_value(value), (key, value)
        assert meta["annotations"][N.ANN_JOB_ID] == job  # the raw id, kept exactly
        text = yaml.safe_dump(body)
        again = yaml.safe_load(text)
        assert again == body and again["kind"] in ("Deployment", "Service")
        assert "\x1b" not in text and "\u202e" not in text  # escaped in the YAML
    template = r.body["spec"]["template"]["metadata"]["labels"]
    assert all(N.is_label_value(v) for v in template.values())
    assert not job or job not in " ".join(container(r.body)["args"])


def test_sanitized_values_never_collide():
    hostile = "Foo Bar"
    hashed = N.label_value(hostile)
    assert hashed != hostile and N.is_label_value(hashed)
    # a crafted id equal to another id's hashed form is hashed again, so it cannot
    # select the other job's pods
    assert N.label_value(hashed) != hashed
    assert N.object_name(hashed) != N.object_name(hostile)
    assert N.label_value("chat-us-70b") == "chat-us-70b"  # ordinary ids stay readable
    assert N.object_name("chat-us-70b-d1") == "koi-chat-us-70b-d1"
    ids = {f"job {i}" for i in range(200)} | {f"job-{i}" for i in range(200)}
    assert len({N.label_value(i) for i in ids}) == len(ids)
    assert len({N.object_name(i) for i in ids}) == len(ids)


# --- multi-node: LeaderWorkerSet ------------------------------------------------------

def test_a_replica_wider_than_a_node_becomes_a_leaderworkerset():
    cfg = engine_default_config("llama-3.1-405b", "h100-sxm", "vllm", catalog=CAT, tp=8,
                                pp=2, multi_node=True, weight_precision="fp8")
    r = render(workload(cfg, replicas=3), CAT, OPTS)
    assert r.kind == KIND_LWS
    assert r.body["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert validate(r.body) == []
    spec = r.body["spec"]
    assert spec["replicas"] == 3 and spec["leaderWorkerTemplate"]["size"] == 2
    leader, worker = container(r.body, "leaderTemplate"), container(r.body, "workerTemplate")
    assert leader["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert "leader" in leader["command"][2] and "vllm serve" in leader["command"][2]
    assert flag_value(leader["args"], "--distributed-executor-backend") == "ray"
    assert flag_value(leader["args"], "--pipeline-parallel-size") == "2"
    assert "worker" in worker["command"][2] and "readinessProbe" not in worker
    lt = spec["leaderWorkerTemplate"]
    assert lt["leaderTemplate"]["metadata"]["labels"][N.LABEL_SERVING] == "true"
    assert lt["workerTemplate"]["metadata"]["labels"][N.LABEL_SERVING] == "false"
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxUnavailable": 0,
                                                                     "maxSurge": 1}


def test_sglang_across_nodes_uses_the_lws_variables():
    cfg = engine_default_config("llama-3.1-405b", "h100-sxm", "sglang", catalog=CAT, tp=16,
                                multi_node=True, weight_precision="fp8")
    r = render(workload(cfg), CAT, OPTS)
    args = container(r.body, "workerTemplate")["args"]
    assert flag_value(args, "--nnodes") == "2"
    assert flag_value(args, "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert flag_value(args, "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
    assert validate(r.body) == []


def test_trtllm_across_nodes_is_refused():
    cfg = engine_default_config("llama-3.1-405b", "h100-sxm", "trtllm", catalog=CAT, tp=8,
                                pp=2, multi_node=True, weight_precision="fp8")
    with pytest.raises(ManifestError, match="MPI"):
        render(workload(cfg), CAT, ManifestOptions(checkpoints={
            "llama-3.1-405b/fp8": "org/405b-fp8"}))


# --- labels, selectors, placement ----------------------------------------------------

def test_labels_selectors_and_the_service():
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)
    body = render(workload(cfg, tick=12, replicas=4), CAT, OPTS).body
    labels = body["metadata"]["labels"]
    assert labels[N.LABEL_JOB] == "chat" and labels[N.LABEL_DEPLOYMENT] == "chat-d1"
    assert labels[N.LABEL_MANAGED_BY] == "koi" and labels[N.LABEL_PLAN_TICK] == "12"
    assert labels[N.LABEL_CONFIG_HASH] == config_hash(cfg.with_(
        offering="aws/us-east-1/h100-sxm/on_demand"))
    assert body["metadata"]["namespace"] == "koi"
    selector = body["spec"]["selector"]["matchLabels"]
    pod_labels = body["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert N.LABEL_PLAN_TICK not in pod_labels  # a new tick must not restart pods
    svc = render_service("chat", OPTS).body
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    strategy = body["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def test_scaling_does_not_change_the_pod_template():
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)
    a = render(workload(cfg, replicas=2, tick=1), CAT, OPTS).body
    b = render(workload(cfg, replicas=9, tick=5), CAT, OPTS).body
    assert a["spec"]["template"] == b["spec"]["template"]


@pytest.mark.parametrize(("cloud", "market", "term"), [
    ("aws", Market.SPOT, [("karpenter.sh/capacity-type", "In", ["spot"])]),
    ("aws", Market.ON_DEMAND, [("karpenter.sh/capacity-type", "In", ["on-demand"])]),
    ("gcp", Market.SPOT, [("cloud.google.com/gke-spot", "In", ["true"])]),
    ("gcp", Market.ON_DEMAND, [("cloud.google.com/gke-spot", "DoesNotExist", None),
                               ("cloud.google.com/gke-preemptible", "DoesNotExist", None)]),
    ("azure", Market.SPOT, [("kubernetes.azure.com/scalesetpriority", "In", ["spot"])]),
    ("runpod", Market.SPOT, None),
])
def test_node_placement_by_cloud_and_market(cloud, market, term):
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)
    off = offering("h100-sxm", cloud, market, region="r-1")
    body = render(workload(cfg, off), CAT, OPTS).body
    pod = body["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {N.LABEL_ACCELERATOR: "h100-sxm",
                                   "topology.kubernetes.io/region": "r-1"}
    terms = [[(e["key"], e["operator"], e.get("values")) for e in t["matchExpressions"]]
             for t in pod["affinity"]["nodeAffinity"][
                 "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]
    capacity = {Market.SPOT: "spot", Market.ON_DEMAND: "on-demand"}[market]
    assert terms[0] == [(N.LABEL_CAPACITY, "In", [capacity])]  # Koi's label, always
    if term is None:
        assert len(terms) == 1
    else:
        assert term in terms
    tolerations = {(t["key"], t.get("value")) for t in pod["tolerations"]}
    assert ("nvidia.com/gpu", None) in tolerations
    assert ((N.LABEL_CAPACITY, "spot") in tolerations) == (market == Market.SPOT)
    if cloud == "azure" and market == Market.SPOT:
        assert ("kubernetes.azure.com/scalesetpriority", "spot") in tolerations
    assert validate(body) == []


def test_schema_validator_rejects_what_kubernetes_would():
    cfg = engine_default_config("llama-3.1-8b", "h100-sxm", "vllm", catalog=CAT)
    body = render(workload(cfg), CAT, OPTS).body
    bad = json.loads(json.dumps(body))
    bad["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    bad["spec"]["replicas"] = "2"
    del bad["spec"]["selector"]
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = True
    errors = validate(bad)
    assert any("gpus: unknown field" in e for e in errors)
    assert any("replicas: expected integer" in e for e in errors)
    assert any("missing required field 'selector'" in e for e in errors)
    assert any("containerPort: expected integer" in e for e in errors)
    bad2 = json.loads(json.dumps(body))
    bad2["spec"]["template"]["spec"]["volumes"][0]["hostPath"] = {"path": "/"}
    assert any("not in the stored subset" in e for e in validate(bad2))

