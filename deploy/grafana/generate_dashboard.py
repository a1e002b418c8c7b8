#!/usr/bin/env python3
"""Writes deploy/grafana/fusedserve-dashboard.json, the Grafana dashboard of fusedserve.

The panels are data here (title, unit, PromQL) so the JSON stays consistent
(ids, grid layout, datasource, variables); edit this file and re-run it.
tests/deploy checks that the committed JSON equals this render, that every
query parses (promtool) and uses only metrics documented in docs/metrics.md.

usage: generate_dashboard.py [--check]
"""
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "fusedserve-dashboard.json"

# Every query filters on these template variables.
SEL = 'job=~"$job", namespace=~"$namespace", pod=~"$pod"'
OPSEL = SEL + ', op=~"$op"'
RATE = "$__rate_interval"


def q(expr, legend):
    return {"expr": expr, "legend": legend}


def quantiles(metric, by, sel, qs=(0.5, 0.99)):
    by_le = ", ".join(["le", *by])
    label = "".join("{{%s}} " % b for b in by)
    return [q(f"histogram_quantile({x}, sum by ({by_le}) (rate({metric}_bucket{{{sel}}}[{RATE}])))",
              f"{label}p{int(x * 100)}") for x in qs]


# (row title, [panel, ...]); a panel: (title, unit, kind, [queries], description)
ROWS = [
    ("Traffic", [
        ("Request rate by RPC and code", "reqps", "timeseries",
         [q(f"sum by (rpc, code) (rate(fusedserve_requests_total{{{SEL}}}[{RATE}]))", "{{rpc}} {{code}}")],
         "RPCs finished per second, by method and status code."),
        ("Error ratio by code", "percentunit", "timeseries",
         [q(f'sum by (code) (rate(fusedserve_requests_total{{{SEL}, code!="OK"}}[{RATE}])) '
            f"/ ignoring(code) group_left sum(rate(fusedserve_requests_total{{{SEL}}}[{RATE}]))", "{{code}}")],
         "Share of requests ending in each non-OK code. RESOURCE_EXHAUSTED means full queues."),
        ("Ready replicas", "short", "stat",
         [q(f"sum(fusedserve_ready{{{SEL}}})", "ready"),
          q(f"count(fusedserve_ready{{{SEL}}})", "pods")],
         "Pods that finished warm-up and report SERVING, of all pods scraped."),
    ]),
    ("Latency (FusedOp)", [
        ("p50 latency per op", "s", "timeseries",
         quantiles("fusedserve_request_duration_seconds", ["op"], OPSEL + ', rpc="FusedOp"', (0.5,)),
         "Server-side median FusedOp latency per op."),
        ("p99 latency per op", "s", "timeseries",
         quantiles("fusedserve_request_duration_seconds", ["op"], OPSEL + ', rpc="FusedOp"', (0.99,)),
         "Server-side p99 FusedOp latency per op."),
        ("p99 latency per RPC", "s", "timeseries",
         quantiles("fusedserve_request_duration_seconds", ["rpc"], SEL, (0.99,)),
         "p99 per gRPC method (Generate: the whole stream)."),
        ("FusedOp latency breakdown (mean per stage)", "s", "timeseries",
         [q(f"sum by (stage) (rate(fusedserve_fused_op_stage_seconds_sum{{{SEL}}}[{RATE}])) "
            f"/ sum by (stage) (rate(fusedserve_fused_op_stage_seconds_count{{{SEL}}}[{RATE}]))", "{{stage}}")],
         "Where a FusedOp's time goes: receive (body parsed), decode (validated), queue (scheduler), "
         "h2d / kernel / d2h (per launch), encode (response serialized), send (until gRPC reports it sent)."),
        ("FusedOp stage p99", "s", "timeseries",
         quantiles("fusedserve_fused_op_stage_seconds", ["stage"], SEL, (0.99,)),
         "p99 of each stage of the breakdown."),
        ("Inline launches", "percentunit", "timeseries",
         [q(f"sum(rate(fusedserve_inline_launches_total{{{SEL}}}[{RATE}])) "
            f"/ sum(rate(fusedserve_batch_size_count{{{SEL}}}[{RATE}]))", "inline")],
         "Share of FusedOp launches run on the gRPC thread that received the request (idle server, small op)."),
    ]),
    ("Batching", [
        ("Queue time per op", "s", "timeseries",
         quantiles("fusedserve_queue_duration_seconds", ["op"], OPSEL),
         "Time requests wait in the batcher before their launch (p50, p99)."),
        ("Mean batch size per op", "short", "timeseries",
         [q(f"sum by (op) (rate(fusedserve_batch_size_sum{{{OPSEL}}}[{RATE}])) "
            f"/ sum by (op) (rate(fusedserve_batch_size_count{{{OPSEL}}}[{RATE}]))", "{{op}}")],
         "Requests merged per kernel launch."),
        ("Queue depth", "short", "timeseries",
         [q(f"sum by (pod) (fusedserve_queue_depth{{{OPSEL}}})", "{{pod}}")],
         "Requests queued per pod (the autoscaler's metric; target 16 per pod)."),
        ("Kernel time per op (p99)", "s", "timeseries",
         quantiles("fusedserve_kernel_duration_seconds", ["op"], OPSEL, (0.99,)),
         "Device time of one batched launch."),
    ]),
    ("Generation", [
        ("Time to first token", "s", "timeseries",
         quantiles("fusedserve_time_to_first_token_seconds", [], SEL),
         "From request arrival to the first generated token (p50, p99)."),
        ("Time per output token", "s", "timeseries",
         quantiles("fusedserve_time_per_output_token_seconds", [], SEL),
         "Mean time per generated token after the first (p50, p99 over requests)."),
        ("Token send time", "s", "timeseries",
         quantiles("fusedserve_generate_token_send_seconds", [], SEL),
         "From a token being sampled to the stream message carrying it being sent (p50, p99)."),
        ("Engine step: forward pass and host time between", "s", "timeseries",
         quantiles("fusedserve_engine_step_seconds", ["part"], SEL),
         "One forward pass of the running batch, and the host's time from one forward pass to the next "
         "(scheduling, sampling, streaming; the GPU waits then), p50 and p99."),
        ("Tokens per second", "short", "timeseries",
         [q(f"sum(rate(fusedserve_generated_tokens_total{{{SEL}}}[{RATE}]))", "generated"),
          q(f"sum(rate(fusedserve_prompt_tokens_total{{{SEL}}}[{RATE}]))", "prompt")],
         "Decode throughput (generated) and prefill throughput (prompt)."),
        ("Running and waiting sequences", "short", "timeseries",
         [q(f"sum(fusedserve_requests_running{{{SEL}}})", "running"),
          q(f"sum(fusedserve_requests_waiting{{{SEL}}})", "waiting")],
         "Sequences in the decode batch, and admitted requests waiting for a slot or KV cache."),
        ("KV-cache use", "percentunit", "timeseries",
         [q(f"sum by (pod) (fusedserve_kv_cache_blocks_used{{{SEL}}}) "
            f"/ sum by (pod) (fusedserve_kv_cache_blocks_total{{{SEL}}})", "{{pod}}")],
         "Share of KV-cache blocks held by sequences, per pod."),
    ]),
    ("Warm-up and tuning cache", [
        ("Tuning cache hits and misses", "short", "timeseries",
         [q(f"sum(increase(fusedserve_tuning_cache_hits_total{{{SEL}}}[$__range]))", "hits"),
          q(f"sum(increase(fusedserve_tuning_cache_misses_total{{{SEL}}}[$__range]))", "misses"),
          q(f"sum(increase(fusedserve_tuning_benchmarks_total{{{SEL}}}[$__range]))", "configs benchmarked")],
         "Envelope entries found in / missing from the cache at start-up over the dashboard range; "
         "benchmarks stay 0 when replicas start warm."),
        ("Tuning cache rejected", "short", "timeseries",
         [q(f"sum by (reason) (increase(fusedserve_tuning_cache_rejected_total{{{SEL}}}[$__range]))", "{{reason}}")],
         "Cache files not used: stale (other GPU/build), corrupt, unwritable."),
        ("Warm-up duration", "s", "timeseries",
         [q(f"max by (pod) (fusedserve_warmup_duration_seconds{{{SEL}}})", "{{pod}}")],
         "Start-up warm-up wall time of each pod."),
    ]),
    ("GPU", [
        ("GPU memory used", "bytes", "timeseries",
         [q(f"sum by (pod) (fusedserve_gpu_memory_used_bytes{{{SEL}}})", "{{pod}}")],
         "Device memory held by each server (weights, KV cache, workspaces)."),
    ]),
]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def panel(pid, title, unit, kind, queries, description, x, y, w, h):
    targets = [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": t["expr"],
                "legendFormat": t["legend"], "range": True, "editorMode": "code"}
               for i, t in enumerate(queries)]
    p = {
        "id": pid, "type": kind, "title": title, "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": targets,
    }
    if kind == "timeseries":
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
        p["fieldConfig"]["defaults"]["custom"] = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
    else:
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "none", "textMode": "value_and_name"}
    return p


def variable(name, label, query, include_all=True):
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
        "refresh": 2, "sort": 1, "multi": True, "includeAll": include_all,
        "allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
    }


def build():
    panels, pid, y = [], 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []})
        pid, y = pid + 1, y + 1
        # Up to three panels per line, 8 units high.
        for i in range(0, len(row_panels), 3):
            line = row_panels[i:i + 3]
            w = 24 // len(line)
            for j, (title, unit, kind, queries, desc) in enumerate(line):
                panels.append(panel(pid, title, unit, kind, queries, desc, j * w, y, w, 8))
                pid += 1
            y += 8
    return {
        "uid": "fusedserve",
        "title": "fusedserve",
        "description": "fusedserve inference service: traffic, latency, batching, generation, "
                       "tuning cache and GPU memory (metrics documented in docs/metrics.md).",
        "tags": ["fusedserve", "inference", "gpu"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "regex": ""},
            variable("job", "Job", "label_values(fusedserve_requests_total, job)"),
            variable("namespace", "Namespace", 'label_values(fusedserve_requests_total{job=~"$job"}, namespace)'),
            variable("pod", "Pod", 'label_values(fusedserve_requests_total{job=~"$job", namespace=~"$namespace"}, pod)'),
            variable("op", "Op", 'label_values(fusedserve_requests_total{job=~"$job", rpc="FusedOp"}, op)'),
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{OUT.name} matches its generator")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
