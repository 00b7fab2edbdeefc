"""Deploy files from the cluster profile: render their node-group parts, and find drift.

The cluster profile (``orchestrator/domain/profiles/*.yaml``) is the one place node groups
are declared. Three deploy targets carry the same groups in their own words:

========  =================================  ==========================================
target    file                               a node group is...
========  =================================  ==========================================
compose   ``docker-compose.yml``             a service whose environment has
                                             ``RAY_NODE_TYPE_NAME``; ``ray start`` flags
kuberay   ``deploy/kubernetes/base/``        ``headGroupSpec`` / a ``workerGroupSpecs``
          (``raycluster.yaml``)              entry named after the group
aws       ``deploy/ray-cluster-aws.yaml``    an ``available_node_types`` entry named
                                             after the group
========  =================================  ==========================================

This module owns only the node-group parts: the group's name and role, its market
(the ``ray.io/market-type`` label), the Ray resources a node advertises, how many
nodes there are, and how many physical GPUs a node's container asks for. Images,
ports, secrets and storage stay hand-written in the files.

Words used below:

- *facts*: what one file says about one group, read into :class:`GroupFacts`.
- *expected*: the facts the profile implies for a target (:func:`expected_facts`).
- *drift*: a difference between the two, one line per difference (:func:`check`).

Two rules that are not obvious:

- A node's Ray resources are ``CPU``, ``GPU``, ``memory`` (bytes) and, for a group
  with an accelerator, ``accelerator_type:<TYPE>: 1``: the value Ray itself gives
  that resource on a node where it detects the accelerator.
- Physical GPUs (a compose device reservation, a ``nvidia.com/gpu`` limit) must equal
  the group's GPU count when present. When absent, the group's GPUs are logical only,
  as on the local development cluster; that is what the CPU-only compose override and
  the kind/minikube overlay do on machines without GPUs.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from raylane.orchestrator.domain.profile import NodeGroup, Profile

TARGETS = ("compose", "kuberay", "aws")
GiB = 1024**3
NVIDIA_GPU = "nvidia.com/gpu"
KUBERAY_CLUSTER_NAME = "raylane"
# In compose, workers reach the head's GCS through its service name.
COMPOSE_HEAD_ADDRESS = "ray-head:6379"


# ---------------------------------------------------------------------------
# What a group is, per target


@dataclass
class GroupFacts:
    """What a deploy file says about one node group (or what the profile expects)."""

    name: str
    role: str  # "head" | "worker"
    market: str | None
    resources: dict[str, float]
    min_nodes: int | None = None  # None: the target has no such notion for this group
    max_nodes: int | None = None
    gpu_devices: int | None = None  # physical GPUs the container gets; None: none asked
    labels: dict[str, str] = field(default_factory=dict)  # explicit Ray node labels, if the file sets them
    where: str = ""  # where in the file, for messages


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def ray_resources(group: NodeGroup) -> dict[str, int | float]:
    """The Ray resources one node of ``group`` advertises."""
    out: dict[str, int | float] = {"CPU": _num(group.cpus), "GPU": group.gpus, "memory": int(group.memory_gb * GiB)}
    if group.accelerator:
        out[f"accelerator_type:{group.accelerator.type}"] = 1
    return out


def _custom(resources: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}


def compose_service_name(group: NodeGroup) -> str:
    """``ray-head``, ``ray-gpu``, ``ray-spot`` (for ``spot-cpu``), ``ray-cpu``."""
    if group.role == "head":
        return "ray-head"
    return "ray-" + (group.name.removesuffix("-cpu") or group.name)


def expected_facts(profile: Profile, target: str) -> dict[str, GroupFacts]:
    """The facts ``profile`` implies for each group in ``target``'s deploy file."""
    _target(target)
    out: dict[str, GroupFacts] = {}
    for g in profile.groups:
        head = g.role == "head"
        f = GroupFacts(name=g.name, role=g.role, market=g.market, resources=dict(ray_resources(g)),
                       gpu_devices=g.gpus or None)
        if target == "compose":
            # Compose has no autoscaler: the profile's local node count is the replica count.
            f.min_nodes = f.max_nodes = 1 if head else g.local_nodes
        elif not head:
            f.min_nodes, f.max_nodes = g.min_nodes, g.max_nodes
        if target == "aws":
            f.labels = dict(g.labels())
        out[g.name] = f
    return out


def _target(target: str) -> None:
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; one of {', '.join(TARGETS)}")


# ---------------------------------------------------------------------------
# Rendering: the node-group parts of each file, as YAML to read or paste


def render(target: str, profile: Profile) -> str:
    """The node-group parts of ``target``'s deploy file for ``profile``, as YAML."""
    _target(target)
    body = {"compose": _render_compose, "kuberay": _render_kuberay, "aws": _render_aws}[target](profile)
    where = {"compose": "docker-compose.yml", "kuberay": "deploy/kubernetes/base/raycluster.yaml",
             "aws": "deploy/ray-cluster-aws.yaml"}[target]
    head = (f"# Node-group parts of {where}, rendered from cluster profile '{profile.name}'.\n"
            f"# The rest of the file (images, ports, secrets, storage) is written by hand.\n"
            f"# `raylane-server profile render --target {target} --check FILE` reports drift.\n")
    return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=False, width=120)


def ray_start_flags(group: NodeGroup) -> list[str]:
    """The ``ray start`` flags that carry a group's resources."""
    r = ray_resources(group)
    flags = [f"--num-cpus={r['CPU']}", f"--num-gpus={r['GPU']}", f"--memory={r['memory']}"]
    if _custom(r):
        flags.append("--resources=" + json.dumps(_custom(r), separators=(", ", ": ")))
    return flags


def _render_compose(profile: Profile) -> dict:
    services: dict[str, Any] = {}
    for g in profile.groups:
        head = g.role == "head"
        cmd = ["ray", "start", "--block"]
        cmd += ["--head", "--port=6379", "--dashboard-host=0.0.0.0"] if head else [f"--address={COMPOSE_HEAD_ADDRESS}"]
        svc: dict[str, Any] = {
            "command": cmd + ray_start_flags(g),
            "environment": {"RAY_NODE_TYPE_NAME": g.name, "RAY_NODE_MARKET_TYPE": g.market},
        }
        if not head:
            deploy: dict[str, Any] = {"replicas": g.local_nodes}
            if g.gpus:
                deploy["resources"] = {"reservations": {"devices": [
                    {"driver": "nvidia", "count": g.gpus, "capabilities": ["gpu"]}]}}
            svc["deploy"] = deploy
        services[compose_service_name(g)] = svc
    return {"services": services}


def _k8s_resources(group: NodeGroup) -> dict[str, str]:
    r = ray_resources(group)
    out = {"CPU": str(r["CPU"]), "GPU": str(r["GPU"]), "memory": _gi(group.memory_gb)}
    out.update({k: str(v) for k, v in _custom(r).items()})
    return out


def _gi(gb: float) -> str:
    return f"{_num(gb)}Gi" if float(gb).is_integer() else f"{int(gb * 1024)}Mi"


def _render_kuberay(profile: Profile) -> dict:
    def container(g: NodeGroup, name: str) -> dict:
        c: dict[str, Any] = {"name": name, "env": [{"name": "RAY_NODE_MARKET_TYPE", "value": g.market}]}
        if g.gpus:
            c["resources"] = {"limits": {NVIDIA_GPU: g.gpus}}
        return c

    head = profile.head
    spec: dict[str, Any] = {
        "headGroupSpec": {"resources": _k8s_resources(head),
                          "template": {"spec": {"containers": [container(head, "ray-head")]}}},
        "workerGroupSpecs": [
            {"groupName": g.name, "replicas": g.min_nodes, "minReplicas": g.min_nodes, "maxReplicas": g.max_nodes,
             "resources": _k8s_resources(g),
             "template": {"spec": {"containers": [container(g, "ray-worker")]}}}
            for g in profile.workers
        ],
    }
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": KUBERAY_CLUSTER_NAME}, "spec": spec}


def _render_aws(profile: Profile) -> dict:
    types: dict[str, Any] = {}
    for g in profile.groups:
        t: dict[str, Any] = {}
        if g.role == "worker":
            t["min_workers"], t["max_workers"] = g.min_nodes, g.max_nodes
        t["resources"] = dict(ray_resources(g))
        t["labels"] = dict(g.labels())
        if g.is_spot:
            t["node_config"] = {"InstanceMarketOptions": {"MarketType": "spot"}}
        types[g.name] = t
    return {"max_workers": sum(g.max_nodes for g in profile.workers), "head_node_type": profile.head.name,
            "available_node_types": types}


# ---------------------------------------------------------------------------
# Reading facts back out of the files


def _load_docs(path: Path) -> list[dict]:
    files = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml")) if path.is_dir() else [path]
    docs: list[dict] = []
    for p in files:
        docs += [d for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict)]
    return docs


def _env(env: Any) -> dict[str, str]:
    """A compose ``environment`` (map or ``K=V`` list) or a Kubernetes ``env`` list, as a dict."""
    if isinstance(env, dict):
        return {str(k): "" if v is None else str(v) for k, v in env.items()}
    out: dict[str, str] = {}
    for item in env or []:
        if isinstance(item, dict):  # Kubernetes: {name, value} or {name, valueFrom}
            if "value" in item:
                out[item["name"]] = str(item["value"])
        else:
            k, _, v = str(item).partition("=")
            out[k] = v
    return out


def _argv(service: dict) -> list[str]:
    argv: list[str] = []
    for key in ("entrypoint", "command"):
        v = service.get(key)
        argv += shlex.split(v) if isinstance(v, str) else [str(x) for x in (v or [])]
    if len(argv) >= 3 and argv[0] in ("sh", "/bin/sh", "bash", "/bin/bash") and argv[1] == "-c":
        argv = shlex.split(argv[2])
    return argv


# `ray start` flags that take no value (the others may be `--flag value`).
_BOOL_FLAGS = {"head", "block", "disable-usage-stats", "include-dashboard", "no-monitor", "include-log-monitor"}


def parse_ray_start(argv: list[str]) -> dict[str, str] | None:
    """``ray start`` flags from a command line: ``{"num-cpus": "4", "head": "", ...}``; None without one."""
    for i in range(len(argv) - 1):
        if Path(argv[i]).name == "ray" and argv[i + 1] == "start":
            rest = argv[i + 2:]
            break
    else:
        return None
    flags: dict[str, str] = {}
    j = 0
    while j < len(rest):
        a = rest[j]
        if a in ("&&", ";", "|"):
            break
        if a.startswith("--"):
            k, eq, v = a[2:].partition("=")
            if not eq and j + 1 < len(rest) and not rest[j + 1].startswith("--") and k not in _BOOL_FLAGS:
                v, j = rest[j + 1], j + 1
            flags[k] = v
        j += 1
    return flags



def _resources_from_flags(flags: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for flag, key in (("num-cpus", "CPU"), ("num-gpus", "GPU"), ("memory", "memory")):
        if flag in flags:
            out[key] = _num(float(flags[flag]))
    if flags.get("resources"):
        raw = flags["resources"].strip().strip("'")
        try:
            custom = json.loads(raw)
            if isinstance(custom, str):  # KubeRay's '"{\"a\": 1}"' form
                custom = json.loads(custom)
        except ValueError:
            raise ValueError(f"--resources is not JSON: {raw!r}") from None
        out.update({k: _num(float(v)) for k, v in custom.items()})
    return out


def compose_facts(doc: dict) -> dict[str, GroupFacts]:
    """Groups of a compose file: the services whose environment names a node group."""
    out: dict[str, GroupFacts] = {}
    for svc_name, svc in (doc.get("services") or {}).items():
        env = _env(svc.get("environment"))
        group = env.get("RAY_NODE_TYPE_NAME")
        if not group:
            continue
        flags = parse_ray_start(_argv(svc)) or {}
        deploy = svc.get("deploy") or {}
        replicas = deploy.get("replicas", svc.get("scale", 1))
        devices = ((deploy.get("resources") or {}).get("reservations") or {}).get("devices") or []
        gpus = sum(int(d.get("count", 0)) if str(d.get("count", "")).isdigit() else 0
                   for d in devices if "gpu" in (d.get("capabilities") or []))
        out[group] = GroupFacts(
            name=group, role="head" if "head" in flags else "worker", market=env.get("RAY_NODE_MARKET_TYPE"),
            resources=_resources_from_flags(flags), min_nodes=int(replicas), max_nodes=int(replicas),
            gpu_devices=gpus or None, where=f"service {svc_name}",
        )
    return out


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}


def k8s_quantity(q: Any) -> float:
    """A Kubernetes quantity (``"4Gi"``, ``"500m"``, ``2``) as a number."""
    m = _QUANTITY.match(str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"not a Kubernetes quantity: {q!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def _kuberay_group(spec: dict, name: str, role: str, where: str) -> GroupFacts:
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    ray = containers[0]  # KubeRay: the Ray container is the first one
    if spec.get("resources"):
        res = {k: _num(round(k8s_quantity(v))) if k == "memory" else _num(k8s_quantity(v))
               for k, v in spec["resources"].items()}
    else:
        res = _resources_from_flags({k: str(v) for k, v in (spec.get("rayStartParams") or {}).items()})
    limits = (ray.get("resources") or {}).get("limits") or {}
    gpus = int(k8s_quantity(limits[NVIDIA_GPU])) if NVIDIA_GPU in limits else None
    f = GroupFacts(name=name, role=role, market=_env(ray.get("env")).get("RAY_NODE_MARKET_TYPE"), resources=res,
                   gpu_devices=gpus, where=where)
    if role == "worker":
        f.min_nodes, f.max_nodes = spec.get("minReplicas"), spec.get("maxReplicas")
    return f


def kuberay_facts(docs: Iterable[dict], head_name: str) -> dict[str, GroupFacts]:
    """Groups of the RayCluster among ``docs``. KubeRay names the head group
    ``headgroup``; it stands for the profile's head group ``head_name``."""
    clusters = [d for d in docs if d.get("kind") == "RayCluster"]
    if len(clusters) != 1:
        raise ValueError(f"expected one RayCluster, found {len(clusters)}")
    spec = clusters[0].get("spec") or {}
    out = {head_name: _kuberay_group(spec.get("headGroupSpec") or {}, head_name, "head", "headGroupSpec")}
    for w in spec.get("workerGroupSpecs") or []:
        out[w["groupName"]] = _kuberay_group(w, w["groupName"], "worker", f"workerGroupSpecs[{w['groupName']}]")
    return out


def aws_facts(doc: dict) -> dict[str, GroupFacts]:
    """Groups of a Ray cluster-launcher config: its ``available_node_types``."""
    out: dict[str, GroupFacts] = {}
    head = doc.get("head_node_type")
    for name, t in (doc.get("available_node_types") or {}).items():
        labels = {str(k): str(v) for k, v in (t.get("labels") or {}).items()}
        spot = ((t.get("node_config") or {}).get("InstanceMarketOptions") or {}).get("MarketType") == "spot"
        f = GroupFacts(name=name, role="head" if name == head else "worker",
                       market="SPOT" if spot else "ON_DEMAND",
                       resources={k: _num(float(v)) for k, v in (t.get("resources") or {}).items()},
                       labels=labels, where=f"available_node_types.{name}")
        if name != head:
            f.min_nodes, f.max_nodes = t.get("min_workers", 0), t.get("max_workers")
        out[name] = f
    return out


# ---------------------------------------------------------------------------
# Drift


def compare(expected: dict[str, GroupFacts], actual: dict[str, GroupFacts]) -> list[str]:
    """One line per difference between the profile's groups and a file's."""
    drift: list[str] = []
    for name, want in expected.items():
        have = actual.get(name)
        if have is None:
            drift.append(f"group {name}: missing from the file")
            continue
        at = f"group {name} ({have.where})" if have.where else f"group {name}"
        if have.role != want.role:
            drift.append(f"{at}: role {have.role}, profile says {want.role}")
        if have.market != want.market:
            drift.append(f"{at}: market {have.market}, profile says {want.market}")
        if have.resources != want.resources:
            drift.append(f"{at}: Ray resources {_fmt(have.resources)}, profile says {_fmt(want.resources)}")
        for attr, word in (("min_nodes", "min nodes"), ("max_nodes", "max nodes")):
            w, h = getattr(want, attr), getattr(have, attr)
            if w is not None and h != w:
                drift.append(f"{at}: {word} {h}, profile says {w}")
        if have.gpu_devices is not None and have.gpu_devices != (want.gpu_devices or 0):
            drift.append(f"{at}: container gets {have.gpu_devices} GPUs, profile says {want.gpu_devices or 0}")
        for k, v in want.labels.items():
            if have.labels.get(k) != v:
                drift.append(f"{at}: label {k}={have.labels.get(k)}, profile says {v}")
    for name in actual.keys() - expected.keys():
        drift.append(f"group {name} ({actual[name].where}): not in the profile")
    return drift


def _fmt(r: dict[str, float]) -> str:
    return json.dumps(dict(sorted(r.items())))


def facts_from_path(target: str, path: str | Path, profile: Profile) -> dict[str, GroupFacts]:
    _target(target)
    path = Path(path)
    docs = _load_docs(path)
    if target == "kuberay":
        return kuberay_facts(docs, profile.head.name)
    if len(docs) != 1:
        raise ValueError(f"{path}: expected one YAML document, found {len(docs)}")
    return compose_facts(docs[0]) if target == "compose" else aws_facts(docs[0])


def check(target: str, path: str | Path, profile: Profile | None = None) -> list[str]:
    """Drift between ``profile`` (default: the shipped one) and the deploy file at ``path``.

    Args:
        target: ``compose``, ``kuberay`` or ``aws``.
        path: the deploy file; for ``kuberay`` also a directory of manifests (a
            Kustomize base), where a ``profile.yaml`` (the ConfigMap's source) must
            also equal the profile.

    Returns:
        One line per difference; empty when the file is in step.

    Example:
        >>> check("aws", "deploy/ray-cluster-aws.yaml")
        []
    """
    from raylane.orchestrator.domain.profile import default_profile

    profile = profile or default_profile()
    path = Path(path)
    drift = compare(expected_facts(profile, target), facts_from_path(target, path, profile))
    if target == "aws":
        doc = _load_docs(path)[0]
        if doc.get("head_node_type") != profile.head.name:
            drift.append(f"head_node_type {doc.get('head_node_type')}, profile's head group is {profile.head.name}")
        want = sum(g.max_nodes for g in profile.workers)
        if doc.get("max_workers") != want:
            drift.append(f"max_workers {doc.get('max_workers')}, profile's groups add up to {want}")
    if target == "kuberay" and path.is_dir():
        copy = path / "profile.yaml"
        if copy.exists() and Profile.load(copy) != profile:
            drift.append(f"{copy}: differs from profile '{profile.name}' (copy the profile there)")
    return drift

