#!/usr/bin/env python3
"""Offline validation of fusedserve's deployment assets.

What it checks (each line of output is PASS, FAIL or SKIP with the reason):
  1. every YAML file under deploy/ parses;
  2. the kustomizations (deploy/k8s/base, deploy/k8s/overlays/*) render with
     `kustomize build` or `kubectl kustomize` when either is installed; without
     them the base's resource files are checked as they are;
  3. every rendered object validates against the Kubernetes API JSON schemas
     (PyPI kubernetes-validate, strict mode, oldest and newest supported
     versions) and the Prometheus Operator objects against the schemas bundled
     in tests/deploy/schemas; a built-in structural check (apiVersion, kind,
     metadata.name, required spec fields) always runs;
  4. the objects agree with each other and with the server: flags exist in
     server/*.cc, ports and probes match, GPU and security settings, volumes,
     selectors, HPA target and adapter rules, Job vs Deployment;
  5. alerts.yaml / PrometheusRule and the dashboard JSON / its generator are
     in sync, and every metric they (and the adapter rules) use is documented
     in docs/metrics.md;
  6. the Dockerfile and .dockerignore agree with the repository.
With --promql-out it writes every dashboard and adapter query as a recording
rule file so that validate.sh can let promtool parse them.
Needs PyYAML; kubernetes-validate and jsonschema are optional (SKIP).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

try:
    import yaml
except ImportError:
    print("FAIL: PyYAML is not installed (apt-get install python3-yaml, or pip install pyyaml)")
    sys.exit(1)

K8S_VERSIONS = ["1.29.0", None]  # oldest supported; None = newest the validator knows
SERVER_PORT, METRICS_PORT = 50051, 9090


class Report:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        if ok:
            self.passed += 1
            print(f"PASS: {what}")
        else:
            self.failed += 1
            print(f"FAIL: {what}" + (f": {detail}" if detail else ""))
        return ok

    def skip(self, what: str, why: str) -> None:
        self.skipped += 1
        print(f"SKIP: {what}: {why}")


R = Report()


# ---------------------------------------------------------------------------
# loading and rendering

def load_yaml_docs(path: Path) -> List[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomize_tool() -> Optional[List[str]]:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        try:
            out = subprocess.run(["kubectl", "version", "--client", "-o", "json"], capture_output=True,
                                 text=True, timeout=60).stdout
            ver = json.loads(out).get("kustomizeVersion", "")
            major = int(re.match(r"v?(\d+)", ver).group(1)) if re.match(r"v?(\d+)", ver) else 0
            if major >= 4:  # labels: and patches: need kustomize v4+
                return ["kubectl", "kustomize"]
        except (OSError, ValueError, subprocess.SubprocessError, AttributeError):
            pass
    return None


def render(kdir: Path, tool: Optional[List[str]]) -> Optional[List[dict]]:
    if tool is None:
        return None
    p = subprocess.run([*tool, str(kdir)], capture_output=True, text=True, timeout=120)
    if not R.check(p.returncode == 0, f"{' '.join(tool)} {kdir.relative_to(ROOT)}", p.stderr.strip()[-2000:]):
        return []
    return [d for d in yaml.safe_load_all(p.stdout) if d is not None]


def base_resources_unrendered(kdir: Path) -> List[dict]:
    k = load_yaml_docs(kdir / "kustomization.yaml")[0]
    docs: List[dict] = []
    for res in k.get("resources", []):
        docs.extend(load_yaml_docs(kdir / res))
    return docs


def name_of(obj: dict) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def by_kind(docs: List[dict], kind: str) -> List[dict]:
    return [d for d in docs if d.get("kind") == kind]


# ---------------------------------------------------------------------------
# schemas

REQUIRED = {  # kind -> dotted paths that must exist (the built-in structural check)
    "Deployment": ["spec.selector.matchLabels", "spec.template.metadata.labels", "spec.template.spec.containers"],
    "Job": ["spec.template.spec.containers", "spec.template.spec.restartPolicy"],
    "Service": ["spec.ports", "spec.selector"],
    "PersistentVolumeClaim": ["spec.accessModes", "spec.resources.requests.storage"],
    "PodDisruptionBudget": ["spec.selector"],
    "HorizontalPodAutoscaler": ["spec.scaleTargetRef.name", "spec.maxReplicas", "spec.metrics"],
    "ServiceMonitor": ["spec.selector", "spec.endpoints"],
    "PrometheusRule": ["spec.groups"],
    "ConfigMap": ["data"],
}


def get(obj: Any, dotted: str, default=None):
    cur = obj
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return default
    return cur


def structural_check(label: str, docs: List[dict]) -> None:
    problems = []
    name_re = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    for d in docs:
        for key in ("apiVersion", "kind"):
            if not isinstance(d.get(key), str):
                problems.append(f"{name_of(d)}: no {key}")
        name = get(d, "metadata.name")
        if not isinstance(name, str) or not name_re.match(name) or len(name) > 253:
            problems.append(f"{name_of(d)}: bad metadata.name {name!r}")
        for path in REQUIRED.get(d.get("kind"), []):
            if get(d, path) is None:
                problems.append(f"{name_of(d)}: missing {path}")
    R.check(not problems, f"{label}: structure of {len(docs)} objects", "; ".join(problems))


def schema_check(label: str, docs: List[dict]) -> None:
    try:
        import kubernetes_validate
        from kubernetes_validate import utils as kv
    except ImportError:
        R.skip(f"{label}: Kubernetes API schemas", "kubernetes-validate not installed (pip install kubernetes-validate)")
        kv = None
    try:
        import jsonschema
    except ImportError:
        jsonschema = None

    crd_schemas = {p.stem: json.loads(p.read_text()) for p in (HERE / "schemas").glob("*.json")}
    for d in docs:
        api, kind = d.get("apiVersion", ""), d.get("kind", "")
        group_version = re.sub(r"^([^./]*)(?:[.][^/]*)?/", r"\1-", api)  # monitoring.coreos.com/v1 -> monitoring-v1
        crd_key = f"{kind.lower()}-{group_version}"
        if crd_key in crd_schemas:
            if jsonschema is None:
                R.skip(f"{label}: {name_of(d)} schema", "jsonschema not installed")
                continue
            errs = sorted(jsonschema.Draft202012Validator(crd_schemas[crd_key]).iter_errors(d), key=str)
            R.check(not errs, f"{label}: {name_of(d)} against bundled {crd_key}.json",
                    "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errs[:5]))
            continue
        if kv is None:
            continue
        for version in K8S_VERSIONS:
            v = version or kv.latest_version()
            try:
                kv.validate(d, v, strict=True)
                R.check(True, f"{label}: {name_of(d)} against Kubernetes {kv.major_minor(v)} schema (strict)")
            except kv.ValidationError as e:
                R.check(False, f"{label}: {name_of(d)} against Kubernetes {kv.major_minor(v)} schema (strict)",
                        f"{'/'.join(map(str, e.path))}: {e.message}")
            except kv.SchemaNotFoundError as e:
                R.check(False, f"{label}: {name_of(d)} has a schema in Kubernetes {v}", e.message)


# ---------------------------------------------------------------------------
# semantics

def server_flags() -> set:
    flags = set()
    for src in (ROOT / "server").glob("*.cc"):
        flags.update(re.findall(r"ABSL_FLAG\(\s*[^,]+,\s*(\w+)\s*,", src.read_text()))
    return flags


def parse_flags(args: Iterable[str]) -> Dict[str, str]:
    out = {}
    for a in args:
        m = re.match(r"^--([A-Za-z0-9_]+)(?:=(.*))?$", a)
        if m:
            out[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    return out


def port_of(addr: str) -> Optional[int]:
    m = re.search(r":(\d+)$", addr or "")
    return int(m.group(1)) if m else None


def labels_match(selector: Dict[str, str], labels: Dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def prestop_seconds(container: dict) -> float:
    pre = get(container, "lifecycle.preStop") or {}
    if "sleep" in pre:
        return float(pre["sleep"].get("seconds", 0))
    cmd = get(pre, "exec.command") or []
    if cmd and Path(str(cmd[0])).name == "sleep" and len(cmd) > 1:
        return float(cmd[1])
    m = re.search(r"sleep\s+(\d+(?:\.\d+)?)", " ".join(map(str, cmd)))
    return float(m.group(1)) if m else 0.0


def check_pod_security(label: str, what: str, pod: dict, container: dict) -> None:
    psc, csc = pod.get("securityContext", {}), container.get("securityContext", {})
    run_as_user = csc.get("runAsUser", psc.get("runAsUser"))
    R.check((csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True) and run_as_user not in (None, 0),
            f"{label}: {what} runs as a non-root uid", f"runAsNonRoot/runAsUser = {psc}")
    R.check(csc.get("allowPrivilegeEscalation") is False, f"{label}: {what} allowPrivilegeEscalation false")
    R.check(csc.get("readOnlyRootFilesystem") is True, f"{label}: {what} readOnlyRootFilesystem")
    R.check(csc.get("privileged", False) is False and "ALL" in (get(csc, "capabilities.drop") or []),
            f"{label}: {what} unprivileged, all capabilities dropped")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
    tmp = mounts.get("/tmp")
    R.check(tmp is not None and "emptyDir" in vols.get(tmp["name"], {}),
            f"{label}: {what} has a writable /tmp (emptyDir) under the read-only root")
    missing = [m["name"] for m in container.get("volumeMounts", []) if m["name"] not in vols]
    R.check(not missing, f"{label}: {what} mounts only declared volumes", str(missing))


def check_gpu(label: str, what: str, container: dict, gpus: str = "1") -> None:
    limits = get(container, "resources.limits") or {}
    requests = get(container, "resources.requests") or {}
    gpu = limits.get("nvidia.com/gpu")
    R.check(str(gpu) == gpus, f"{label}: {what} limits nvidia.com/gpu: {gpus}", f"got {gpu!r}")
    if "nvidia.com/gpu" in requests:
        R.check(str(requests["nvidia.com/gpu"]) == str(gpu), f"{label}: {what} GPU request equals its limit")
    R.check("memory" in limits and "memory" in requests and "cpu" in requests,
            f"{label}: {what} sets cpu/memory requests and a memory limit")


def mount_for(pod: dict, container: dict, path: str) -> Optional[dict]:
    """The volume holding `path` in the container (longest mountPath prefix)."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"]):
                best = m
    if best is None:
        return None
    return next((v for v in pod.get("volumes", []) if v["name"] == best["name"]), None)


def semantic_checks(label: str, docs: List[dict], flags_known: set, adapter_names: set) -> None:
    deployments = [d for d in by_kind(docs, "Deployment") if get(d, "metadata.labels", {}).get("app.kubernetes.io/name") == "fusedserve"]
    if not R.check(len(deployments) == 1, f"{label}: one fusedserve Deployment", f"found {len(deployments)}"):
        return
    dep = deployments[0]
    pod = dep["spec"]["template"]["spec"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    R.check(labels_match(dep["spec"]["selector"]["matchLabels"], pod_labels),
            f"{label}: Deployment selector matches its pod labels")
    c = pod["containers"][0]
    argv = [*c.get("command", []), *c.get("args", [])]
    R.check(len(argv) >= 2 and Path(argv[0]).name == "fusedserve" and argv[1] == "serve",
            f"{label}: Deployment runs `fusedserve serve`", str(argv[:2]))
    flags = parse_flags(argv)
    unknown = sorted(set(flags) - flags_known)
    R.check(not unknown, f"{label}: Deployment flags exist in server/*.cc", f"unknown: {unknown}")

    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    R.check(port_of(flags.get("listen", "")) == ports.get("grpc") == SERVER_PORT,
            f"{label}: --listen port = containerPort grpc = {SERVER_PORT}", f"{flags.get('listen')} vs {ports}")
    R.check(port_of(flags.get("metrics_listen", "")) == ports.get("metrics") == METRICS_PORT,
            f"{label}: --metrics_listen port = containerPort metrics = {METRICS_PORT}")
    R.check(flags.get("device") in ("cuda", "auto"), f"{label}: --device is cuda or auto", str(flags.get("device")))

    # probes: native gRPC on the serving port; the startup probe covers warm-up
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe) or {}
        R.check(get(p, "grpc.port") == ports.get("grpc"), f"{label}: {probe} is a native gRPC probe on the grpc port",
                str(p.get("grpc")))
    sp = c.get("startupProbe") or {}
    budget = sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3)
    R.check(budget >= 600, f"{label}: startupProbe allows >= 10 min of warm-up", f"{budget} s")

    # graceful shutdown: preStop + drain fit in the grace period
    grace = float(flags.get("shutdown_grace_seconds", "30"))
    pre = prestop_seconds(c)
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    R.check(pre > 0, f"{label}: preStop delay before SIGTERM", "no preStop sleep")
    R.check(tgps >= pre + grace, f"{label}: terminationGracePeriodSeconds >= preStop + --shutdown_grace_seconds",
            f"{tgps} < {pre} + {grace}")

    # one GPU per tensor-parallel rank; a split pod needs more than the
    # runtime's 64 MiB /dev/shm for NCCL
    tp = flags.get("tensor_parallel", "1")
    check_gpu(label, "server", c, tp)
    if tp != "1":
        shm = mount_for(pod, c, "/dev/shm")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        R.check(shm is not None and get(vols.get(shm["name"], {}), "emptyDir.medium") == "Memory",
                f"{label}: --tensor_parallel={tp} pod mounts a memory-backed /dev/shm for NCCL")
    check_pod_security(label, "server", pod, c)

    # volumes: tuning cache on a shared RWX PVC, model mounted
    pvcs = {p["metadata"]["name"]: p for p in by_kind(docs, "PersistentVolumeClaim")}
    cache_vol = mount_for(pod, c, flags.get("tuning_cache", ""))
    claim = get(cache_vol or {}, "persistentVolumeClaim.claimName")
    R.check(claim in pvcs, f"{label}: --tuning_cache lives on a PersistentVolumeClaim of this kustomization",
            f"{flags.get('tuning_cache')} -> {cache_vol}")
    if claim in pvcs:
        R.check("ReadWriteMany" in pvcs[claim]["spec"]["accessModes"], f"{label}: tuning-cache PVC is ReadWriteMany")
    cache_mount = next((m for m in c["volumeMounts"] if cache_vol and m["name"] == cache_vol["name"]), {})
    R.check(cache_mount.get("mountPath") == "/var/cache/fusedserve" and not cache_mount.get("readOnly"),
            f"{label}: tuning cache mounted writable at /var/cache/fusedserve")
    if "model" in flags and flags["model"]:
        model_vol = mount_for(pod, c, flags["model"])
        R.check(model_vol is not None, f"{label}: --model directory is on a mounted volume", flags["model"])
    for v in pod.get("volumes", []):
        cn = get(v, "persistentVolumeClaim.claimName")
        if cn is not None:
            R.check(cn in pvcs, f"{label}: volume {v['name']} claims a PVC defined here ({cn})")

    # services, monitoring, disruption budget, autoscaler
    services = by_kind(docs, "Service")
    svc = [s for s in services if labels_match(s["spec"].get("selector", {}), pod_labels)]
    R.check(bool(svc), f"{label}: a Service selects the server pods")
    for s in svc:
        bad = [p for p in s["spec"]["ports"] if isinstance(p.get("targetPort"), str) and p["targetPort"] not in ports]
        R.check(not bad, f"{label}: Service/{s['metadata']['name']} targetPorts name container ports", str(bad))
    for sm in by_kind(docs, "ServiceMonitor"):
        matched = [s for s in services if labels_match(get(sm, "spec.selector.matchLabels", {}), s["metadata"].get("labels", {}))]
        with_port = [s for s in matched if any(p.get("name") == e.get("port") for e in sm["spec"]["endpoints"] for p in s["spec"]["ports"])]
        R.check(len(with_port) == 1, f"{label}: ServiceMonitor scrapes exactly one Service with its port",
                str([s["metadata"]["name"] for s in with_port]))
        R.check(all(e.get("path", "/metrics") == "/metrics" for e in sm["spec"]["endpoints"]),
                f"{label}: ServiceMonitor scrapes /metrics")
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        R.check(labels_match(get(pdb, "spec.selector.matchLabels", {}), pod_labels),
                f"{label}: PodDisruptionBudget selects the server pods")
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        R.check(ref.get("kind") == "Deployment" and ref.get("name") == dep["metadata"]["name"],
                f"{label}: HPA targets the Deployment")
        R.check("replicas" not in dep["spec"], f"{label}: Deployment leaves replicas to the HPA")
        R.check(1 <= hpa["spec"].get("minReplicas", 1) <= hpa["spec"]["maxReplicas"], f"{label}: HPA replica bounds")
        names = [get(m, "pods.metric.name") or get(m, "object.metric.name") or get(m, "external.metric.name")
                 for m in hpa["spec"]["metrics"]]
        R.check("fusedserve_queue_depth" in names, f"{label}: HPA scales on fusedserve_queue_depth", str(names))
        missing = [n for n in names if n and n.startswith("fusedserve_") and n not in adapter_names]
        R.check(not missing, f"{label}: every HPA metric is served by a prometheus-adapter rule", str(missing))

    # the tune Job: same image, cache, model and envelope-shaping flags
    jobs = [j for j in by_kind(docs, "Job") if "tune" in (get(j, "spec.template.spec.containers.0.command") or []) +
            (get(j, "spec.template.spec.containers.0.args") or [])]
    if R.check(len(jobs) == 1, f"{label}: one Job runs `fusedserve tune`", f"found {len(jobs)}"):
        jpod = jobs[0]["spec"]["template"]["spec"]
        jc = jpod["containers"][0]
        jflags = parse_flags([*jc.get("command", []), *jc.get("args", [])])
        R.check(not (set(jflags) - flags_known), f"{label}: tune Job flags exist in server/*.cc",
                str(sorted(set(jflags) - flags_known)))
        R.check(jc.get("image") == c.get("image"), f"{label}: tune Job uses the server image")
        for f in ("tuning_cache", "model", "model_preset", "envelope", "device", "tensor_parallel"):
            R.check(jflags.get(f) == flags.get(f), f"{label}: tune Job --{f} matches the server",
                    f"{jflags.get(f)!r} vs {flags.get(f)!r}")
        jcache = mount_for(jpod, jc, jflags.get("tuning_cache", ""))
        R.check(get(jcache or {}, "persistentVolumeClaim.claimName") == claim,
                f"{label}: tune Job writes the server's tuning-cache PVC")
        R.check(jpod.get("restartPolicy") in ("Never", "OnFailure"), f"{label}: tune Job restartPolicy")
        check_gpu(label, "tune Job", jc)
        check_pod_security(label, "tune Job", jpod, jc)

    # one namespace for everything an overlay sets one for
    namespaces = {get(d, "metadata.namespace") for d in docs if d.get("kind") != "Namespace"}
    R.check(len(namespaces) == 1, f"{label}: all objects share one namespace", str(namespaces))


# ---------------------------------------------------------------------------
# metrics, rules, dashboard

HISTO_SUFFIXES = ("_bucket", "_sum", "_count")


def documented_metrics() -> Dict[str, str]:
    text = (ROOT / "docs" / "metrics.md").read_text()
    return dict(re.findall(r"^\| `(fusedserve_\w+)` \| (\w+) \|", text, flags=re.M))


def undocumented(expr: str, docs: Dict[str, str]) -> List[str]:
    bad = []
    for name in set(re.findall(r"\bfusedserve_[a-z0-9_]+\b", expr)):
        if name in docs:
            if docs[name] == "histogram":
                bad.append(f"{name} (a histogram: use _bucket/_sum/_count)")
            continue
        base = next((name[: -len(s)] for s in HISTO_SUFFIXES if name.endswith(s)), None)
        if base is None or docs.get(base) != "histogram":
            bad.append(name)
    return sorted(bad)


def adapter_rules() -> (List[dict], List[dict]):
    cm = load_yaml_docs(ROOT / "deploy/k8s/base/prometheus-adapter-rules.yaml")[0]
    from_cm = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    values = load_yaml_docs(ROOT / "deploy/prometheus/adapter-values.yaml")[0]
    return from_cm, values["rules"]["custom"]


def adapter_query(rule: dict) -> str:
    series = re.match(r"\s*(\w+)", rule["seriesQuery"]).group(1)
    return (rule["metricsQuery"].replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'namespace="ns", pod=~"a|b"').replace("<<.GroupBy>>", "pod"))


def dashboard_queries(dash: dict) -> List[tuple]:
    out = []
    for p in dash.get("panels", []):
        for t in p.get("targets", []):
            out.append((p.get("id"), t.get("refId"), t.get("expr", "")))
    return out


def concrete_promql(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced, for promtool."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$__interval", "1m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def check_observability(promql_out: Optional[Path]) -> None:
    docs = documented_metrics()
    R.check(len(docs) >= 21, "docs/metrics.md documents the metrics the server exports", f"{len(docs)} found")
    types_ok = all(t in ("counter", "gauge", "histogram", "summary") for t in docs.values())
    R.check(types_ok, "docs/metrics.md types are Prometheus types")
    R.check(all(n.endswith("_total") for n, t in docs.items() if t == "counter"), "counter names end in _total")

    # alerts.yaml and its generated PrometheusRule
    p = subprocess.run([sys.executable, str(ROOT / "deploy/prometheus/render_prometheusrule.py"), "--check"],
                       capture_output=True, text=True)
    R.check(p.returncode == 0, "deploy/k8s/base/prometheusrule.yaml is rendered from alerts.yaml", p.stderr.strip())
    rules = load_yaml_docs(ROOT / "deploy/prometheus/alerts.yaml")[0]
    names = [r.get("alert") for g in rules["groups"] for r in g["rules"]]
    R.check(len(names) == len(set(names)), "alert names are unique")
    for wanted, pattern in [("high p99 latency", r"duration_seconds_bucket"), ("queue saturation", r"queue_depth|RESOURCE_EXHAUSTED"),
                            ("errors", r'code=~"INTERNAL'), ("not ready", r"fusedserve_ready")]:
        R.check(any(re.search(pattern, r["expr"]) for g in rules["groups"] for r in g["rules"]),
                f"alerts cover {wanted}")
    for g in rules["groups"]:
        for r in g["rules"]:
            bad = undocumented(r["expr"], docs)
            R.check(not bad, f"alert {r.get('alert')} uses documented metrics", str(bad))
            R.check(bool(get(r, "labels.severity")) and bool(get(r, "annotations.summary")),
                    f"alert {r.get('alert')} has a severity and a summary")

    # adapter rules: ConfigMap and Helm values agree, use documented gauges
    from_cm, from_values = adapter_rules()
    R.check(from_cm == from_values, "adapter rules: ConfigMap and adapter-values.yaml agree")
    for rule in from_cm:
        bad = undocumented(rule["seriesQuery"] + " " + adapter_query(rule), docs)
        R.check(not bad, f"adapter rule {rule['name']['as']} uses documented metrics", str(bad))
        series = re.match(r"\s*(\w+)", rule["seriesQuery"]).group(1)
        R.check(docs.get(series) == "gauge", f"adapter rule {rule['name']['as']} reads a gauge")
        R.check(all(k in rule["resources"]["overrides"] for k in ("namespace", "pod")),
                f"adapter rule {rule['name']['as']} maps namespace and pod")

    # dashboard
    p = subprocess.run([sys.executable, str(ROOT / "deploy/grafana/generate_dashboard.py"), "--check"],
                       capture_output=True, text=True)
    R.check(p.returncode == 0, "fusedserve-dashboard.json is its generator's output", p.stderr.strip())
    dash = json.loads((ROOT / "deploy/grafana/fusedserve-dashboard.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    R.check(len(ids) == len(set(ids)), "dashboard panel ids are unique")
    R.check(all(0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in dash["panels"]),
            "dashboard panels fit the 24-column grid")
    var_names = {v["name"] for v in dash["templating"]["list"]}
    queries = dashboard_queries(dash)
    used_vars = {m for _, _, e in queries for m in re.findall(r"\$\{?(\w+)", e) if not m.startswith("__")}
    R.check(used_vars <= var_names, "dashboard queries use only defined variables", str(used_vars - var_names))
    for pid, ref, expr in queries:
        bad = undocumented(expr, docs)
        R.check(not bad and bool(expr), f"dashboard panel {pid}/{ref} uses documented metrics", str(bad))
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("request rate", "p50", "p99", "queue", "batch size", "first token", "per output token",
                  "tokens per second", "kv-cache", "tuning cache", "gpu memory"):
        R.check(topic in titles, f"dashboard has a panel on {topic}")

    if promql_out is not None:
        recs = [{"record": f"dashboard:panel_{pid}_{ref}", "expr": concrete_promql(e)} for pid, ref, e in queries]
        recs += [{"record": f"adapter:{r['name']['as']}", "expr": adapter_query(r)} for r in from_cm]
        promql_out.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-and-adapter-queries", "rules": recs}]},
                                             sort_keys=False))
        print(f"INFO: wrote {len(recs)} queries to {promql_out} for promtool")


# ---------------------------------------------------------------------------
# Dockerfile

def dockerignore_patterns() -> List[str]:
    path = ROOT / ".dockerignore"
    if not path.exists():
        return []
    return [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")]


def ignored(rel: str, patterns: List[str]) -> bool:
    """Docker's .dockerignore semantics for the patterns used here (last match wins, ! re-includes)."""
    result = False
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.rstrip("/")
        for pre in prefixes:
            if fnmatch.fnmatchcase(pre, p) or (p.startswith("**/") and
                                                any(fnmatch.fnmatchcase("/".join(pre.split("/")[i:]), p[3:])
                                                    for i in range(len(pre.split("/"))))):
                result = not neg
                break
    return result


def dockerfile_instructions() -> List[tuple]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        word, _, rest = s.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def check_dockerfile(flags_known: set) -> None:
    ins = dockerfile_instructions()
    froms = [rest for w, rest in ins if w == "FROM"]
    args = dict(re.findall(r"^(\w+)=(\S*)", "\n".join(r for w, r in ins if w == "ARG"), flags=re.M))
    expand = lambda s: re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), s)
    R.check(len(froms) >= 2 and "devel" in expand(froms[0]) and "runtime" in expand(froms[-1]),
            "Dockerfile: CUDA devel builder stage, CUDA runtime final stage", str([expand(f) for f in froms]))
    R.check(all("nvidia/cuda:13.0" in expand(f) and "ubuntu24.04" in expand(f) for f in froms),
            "Dockerfile: CUDA 13.0 on Ubuntu 24.04 base images", str([expand(f) for f in froms]))
    patterns = dockerignore_patterns()
    R.check(bool(patterns), ".dockerignore exists")
    copied = set()
    for w, rest in ins:
        if w != "COPY" or "--from=" in rest:
            continue
        srcs = [t for t in shlex.split(rest) if not t.startswith("--")][:-1]
        for src in srcs:
            rel = src.rstrip("/")
            copied.add(rel.split("/")[0])
            R.check((ROOT / rel).exists(), f"Dockerfile: COPY source {src} exists")
            R.check(not ignored(rel, patterns), f"Dockerfile: COPY source {src} is not excluded by .dockerignore")
    for w, rest in ins:
        if w == "RUN":
            for script in re.findall(r"(?:^|\s|/)(deploy/[\w.-]+\.sh)", rest):
                path = ROOT / script
                R.check(path.exists() and path.stat().st_mode & 0o111, f"Dockerfile: {script} exists and is executable")
    # every top-level directory the build reads must be in the image (tests/
    # and bench/ are switched off by build-release.sh)
    cmake = (ROOT / "CMakeLists.txt").read_text()
    needed = {d for d in re.findall(r"\b([a-z_]+)/", cmake) if (ROOT / d).is_dir()} - {"tests", "bench"}
    needed |= set(re.findall(r"add_subdirectory\((\w+)\)", cmake)) - {"tests", "bench"}
    R.check(needed <= copied, "Dockerfile copies every source directory CMakeLists.txt uses", str(sorted(needed - copied)))
    build_release = (ROOT / "deploy/build-release.sh").read_text()
    R.check("FUSEDSERVE_BUILD_TESTS=OFF" in build_release and "FUSEDSERVE_BUILD_BENCH=OFF" in build_release,
            "build-release.sh switches tests and benchmarks off (not copied into the image)")

    user = [r for w, r in ins if w == "USER"]
    R.check(bool(user) and user[-1].split(":")[0] not in ("0", "root"), "Dockerfile: runs as a non-root USER", str(user))
    volumes = " ".join(r for w, r in ins if w == "VOLUME")
    R.check("/var/cache/fusedserve" in volumes, "Dockerfile: VOLUME /var/cache/fusedserve")
    exposed = " ".join(r for w, r in ins if w == "EXPOSE").split()
    R.check({str(SERVER_PORT), str(METRICS_PORT)} <= set(exposed), "Dockerfile: EXPOSE 50051 9090", str(exposed))
    labels = " ".join(r for w, r in ins if w == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "source"):
        R.check(f"org.opencontainers.image.{key}=" in labels, f"Dockerfile: OCI label org.opencontainers.image.{key}")
    entry = [r for w, r in ins if w == "ENTRYPOINT"]
    cmd = [r for w, r in ins if w == "CMD"]
    argv = json.loads(entry[-1]) + (json.loads(cmd[-1]) if cmd else []) if entry else []
    R.check(len(argv) >= 2 and Path(argv[0]).name == "fusedserve" and argv[1] == "serve",
            "Dockerfile: ENTRYPOINT is `fusedserve serve`", str(argv[:2]))
    flags = parse_flags(argv)
    R.check(not (set(flags) - flags_known), "Dockerfile: ENTRYPOINT/CMD flags exist in server/*.cc",
            str(sorted(set(flags) - flags_known)))
    R.check(flags.get("tuning_cache", "").startswith("/var/cache/fusedserve/"), "Dockerfile: tuning cache on the volume")
    R.check(port_of(flags.get("listen", "")) == SERVER_PORT and port_of(flags.get("metrics_listen", "")) == METRICS_PORT,
            "Dockerfile: default flags listen on the exposed ports")


# ---------------------------------------------------------------------------

def main() -> int:
    global ROOT, HERE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--promql-out", type=Path, help="write dashboard/adapter queries as a promtool rules file")
    a = ap.parse_args()
    ROOT, HERE = a.root.resolve(), Path(__file__).resolve().parent

    yaml_files = sorted(p for p in (ROOT / "deploy").rglob("*.y*ml"))
    for p in yaml_files:
        try:
            load_yaml_docs(p)
            R.check(True, f"parses: {p.relative_to(ROOT)}")
        except yaml.YAMLError as e:
            R.check(False, f"parses: {p.relative_to(ROOT)}", str(e).replace("\n", " "))
    if R.failed:
        print(f"deploy checks: {R.passed} passed, {R.failed} failed, {R.skipped} skipped")
        return 1

    flags_known = server_flags()
    R.check(len(flags_known) >= 5, "server flags found in server/*.cc", str(sorted(flags_known)))
    adapter_names = {r["name"]["as"] for r in adapter_rules()[0]}

    tool = kustomize_tool()
    if tool is None:
        R.skip("kustomize build", "neither kustomize nor kubectl (with kustomize v4+) is installed; "
                                  "checking the base's resource files unrendered, overlays only parsed")
    kdirs = [ROOT / "deploy/k8s/base", *sorted(p.parent for p in (ROOT / "deploy/k8s/overlays").glob("*/kustomization.yaml"))]
    for kdir in kdirs:
        label = str(kdir.relative_to(ROOT / "deploy/k8s"))
        docs = render(kdir, tool)
        if docs is None:
            if kdir.name != "base":
                continue
            docs = base_resources_unrendered(kdir)
            label += " (unrendered)"
        if not docs:
            continue
        structural_check(label, docs)
        schema_check(label, docs)
        semantic_checks(label, docs, flags_known, adapter_names)

    # manifests outside any kustomization (e.g. the example model download Job)
    in_kustomization = set()
    for kdir in kdirs:
        k = load_yaml_docs(kdir / "kustomization.yaml")[0]
        for key in ("resources",):
            in_kustomization |= {(kdir / r).resolve() for r in k.get(key, [])}
        in_kustomization |= {(kdir / p["path"]).resolve() for p in k.get("patches", []) if "path" in p}
        in_kustomization.add((kdir / "kustomization.yaml").resolve())
    for p in sorted((ROOT / "deploy/k8s").rglob("*.yaml")):
        if p.resolve() in in_kustomization:
            continue
        docs = load_yaml_docs(p)
        label = str(p.relative_to(ROOT / "deploy/k8s"))
        structural_check(label, docs)
        schema_check(label, docs)
        for d in docs:
            for c in get(d, "spec.template.spec.containers") or []:
                check_pod_security(label, c["name"], d["spec"]["template"]["spec"], c)

    check_observability(a.promql_out)
    check_dockerfile(flags_known)

    print(f"deploy checks: {R.passed} passed, {R.failed} failed, {R.skipped} skipped")
    return 1 if R.failed else 0


ROOT = HERE = Path(".")

if __name__ == "__main__":
    sys.exit(main())
