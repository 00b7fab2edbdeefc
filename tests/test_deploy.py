"""The deploy files: docker-compose, KubeRay (Kustomize), the Ray cluster launcher, the Dockerfile.

No Docker engine, Kubernetes cluster or cloud account runs here, so each file is
checked against what would read it:

- the KubeRay CRD schemas and the Kubernetes API schemas (``kubernetes-validate``)
  for every object each Kustomize overlay renders to;
- the compose specification's JSON schema for docker-compose.yml and its CPU
  override, and Ray's own ``ray start`` argument parser for every Ray service;
- Ray's own cluster-launcher schema and autoscaler config reader for the AWS file,
  and Ray's KubeRay autoscaler for what each RayCluster group advertises;
- the cluster profile, through ``raylane.orchestrator.tooling.deploy_render`` and the
  ``raylane-server profile render --check`` command: node groups cannot drift;
- the Dockerfile's steps: every COPY source exists, the install line is the
  pinned one, and its command (and the migration commands of compose and the
  Kubernetes Job) run against a throwaway SQLite database.

The schemas live in the ``shared`` folder beside the repository (``../shared``).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from raylane.orchestrator.tooling import deploy_render
from raylane.orchestrator.domain.profile import DEFAULT_PROFILE, Profile, default_profile

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
KUBERAY_CRD = SHARED / "schemas" / "kuberay" / "ray.io_rayclusters.yaml"
COMPOSE_SCHEMA = SHARED / "schemas" / "compose" / "compose-spec.json"
K8S = ROOT / "deploy" / "kubernetes"
BASE = K8S / "base"
OVERLAYS = ["local", "cloud"]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_CPU = ROOT / "docker-compose.cpu.yml"
AWS = ROOT / "deploy" / "ray-cluster-aws.yaml"
DOCKERFILE = ROOT / "Dockerfile"
K8S_VERSION = "1.30"  # a version kubernetes-validate ships schemas for
BIN = Path(sys.executable).parent  # the environment's `raylane` and `ray`

DEPLOY_FILES = [("compose", COMPOSE), ("kuberay", BASE), ("kuberay", BASE / "raycluster.yaml"), ("aws", AWS)]


def _shared(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path} is missing: the shared schemas must sit beside the repository (../shared)")
    return path


# ---------------------------------------------------------------------------
# A small Kustomize: the subset the overlays use (resources, namespace, labels,
# images, configMapGenerator, JSON 6902 patches), so the rendered objects can be
# validated without the kustomize binary.


class PatchError(Exception):
    pass


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")] if path else []


def _json6902(doc: Any, ops: list[dict]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _pointer(op["path"])
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        kind = op["op"]
        if isinstance(node, list):
            idx = len(node) if last == "-" else int(last)
            if kind == "add":
                node.insert(idx, copy.deepcopy(op["value"]))
            elif kind == "remove":
                del node[idx]
            elif kind == "replace":
                node[idx] = copy.deepcopy(op["value"])
            elif kind == "test":
                if node[idx] != op["value"]:
                    raise PatchError(f"test failed at {op['path']}: {node[idx]!r} != {op['value']!r}")
            else:
                raise NotImplementedError(kind)
        else:
            if kind in ("remove", "replace", "test") and last not in node:
                raise PatchError(f"{kind}: no {op['path']}")
            if kind in ("add", "replace"):
                node[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del node[last]
            elif kind == "test":
                if node[last] != op["value"]:
                    raise PatchError(f"test failed at {op['path']}: {node[last]!r} != {op['value']!r}")
            else:
                raise NotImplementedError(kind)
    return doc


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass"}


def _set_images(node: Any, images: list[dict]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for c in value:
                    name = re.split(r"[:@]", c.get("image", ""), maxsplit=1)[0]
                    for img in images:
                        if img["name"] == name:
                            tag = img.get("newTag") or (c["image"].split(":", 1)[1] if ":" in c["image"] else "latest")
                            c["image"] = f"{img.get('newName', name)}:{tag}"
            _set_images(value, images)
    elif isinstance(node, list):
        for v in node:
            _set_images(v, images)


def kustomize_build(path: Path) -> list[dict]:
    k = yaml.safe_load((path / "kustomization.yaml").read_text())
    assert k["kind"] == "Kustomization"
    unsupported = set(k) - {"apiVersion", "kind", "namespace", "labels", "resources", "configMapGenerator",
                            "images", "patches"}
    assert not unsupported, f"{path}: this test's Kustomize does not know {unsupported}"
    docs: list[dict] = []
    for res in k.get("resources", []):
        p = (path / res).resolve()
        assert p.exists(), f"{path}/kustomization.yaml: resource {res} does not exist"
        docs += kustomize_build(p) if p.is_dir() else [d for d in yaml.safe_load_all(p.read_text()) if d]
    for gen in k.get("configMapGenerator", []):
        data = {}
        for f in gen["files"]:
            key, _, src = f.partition("=") if "=" in f else (Path(f).name, "", f)
            data[key] = (path / src).read_text()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for patch in k.get("patches", []):
        text = (path / patch["path"]).read_text() if "path" in patch else patch["patch"]
        ops = yaml.safe_load(text)
        assert isinstance(ops, list), "only JSON 6902 patches are used here"
        t = patch["target"]
        hits = [i for i, d in enumerate(docs) if d["kind"] == t["kind"] and d["metadata"]["name"] == t["name"]]
        assert hits, f"{path}: patch target {t} matches nothing"
        for i in hits:
            docs[i] = _json6902(docs[i], ops)
    _set_images(docs, k.get("images", []))
    for d in docs:
        for pairs in k.get("labels", []):
            d["metadata"].setdefault("labels", {}).update(pairs["pairs"])
        if k.get("namespace"):
            if d["kind"] == "Namespace":
                d["metadata"]["name"] = k["namespace"]
            elif d["kind"] not in CLUSTER_SCOPED:
                d["metadata"]["namespace"] = k["namespace"]
    return docs


def _no_unknown_fields(schema: Any) -> Any:
    """The API server prunes fields a CRD does not declare, silently: a typo such as
    ``enableInTreeAutoscalng`` would vanish. Make them validation errors instead."""
    if isinstance(schema, dict):
        out = {k: _no_unknown_fields(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    return [_no_unknown_fields(v) for v in schema] if isinstance(schema, list) else schema


@pytest.fixture(scope="module")
def raycluster_schema() -> dict:
    crd = yaml.safe_load(_shared(KUBERAY_CRD).read_text())
    v1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return _no_unknown_fields(v1["schema"]["openAPIV3Schema"])


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, kustomize_build(K8S / "overlays" / request.param)


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


def _env(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# ---------------------------------------------------------------------------
# Kubernetes


def test_every_overlay_object_is_valid_for_its_schema(rendered, raycluster_schema):
    import kubernetes_validate

    name, docs = rendered
    kinds = {d["kind"] for d in docs}
    assert {"RayCluster", "Deployment", "Service", "ConfigMap", "Job", "NetworkPolicy", "PodDisruptionBudget",
            "StatefulSet", "ServiceAccount", "Namespace"} <= kinds, kinds
    for d in docs:
        where = f"overlay {name}: {d['kind']} {d['metadata']['name']}"
        if d["kind"] == "RayCluster":
            assert d["apiVersion"] == "ray.io/v1", where
            errors = sorted(jsonschema.Draft7Validator(raycluster_schema).iter_errors(d), key=str)
            assert not errors, f"{where}: " + "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
        else:
            try:
                kubernetes_validate.validate(d, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{where}: {e}")


def test_manifests_reference_secrets_and_never_carry_them(rendered):
    name, docs = rendered
    assert not [d for d in docs if d["kind"] == "Secret"], f"overlay {name} ships a Secret: reference it instead"
    text = json.dumps(docs)
    refs = set(re.findall(r'"secretKeyRef": \{"name": "([^"]+)", "key": "([^"]+)"\}', text))
    assert {("raylane-db", "url"), ("raylane-ray-auth", "auth_token"), ("raylane-redis", "password")} <= refs
    docs_md = (ROOT / "docs" / "deploy.md").read_text()
    for secret, key in refs:  # each referenced Secret is created in the guide
        assert secret in docs_md and key in docs_md, f"docs/deploy.md does not create Secret {secret} ({key})"


def test_raycluster_has_autoscaling_token_auth_and_gcs_fault_tolerance(rendered):
    _, docs = rendered
    rc = _one(docs, "RayCluster", "raylane")
    spec = rc["spec"]
    assert spec["rayVersion"] == "2.60.0"
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["authOptions"] == {"mode": "token", "secretName": "raylane-ray-auth"}
    ft = spec["gcsFaultToleranceOptions"]
    assert ft["redisAddress"].split(":")[0] == _one(docs, "Service", "raylane-redis")["metadata"]["name"]
    assert ft["redisPassword"]["valueFrom"]["secretKeyRef"] == {"name": "raylane-redis", "key": "password"}
    assert ft["externalStorageNamespace"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for g in groups:
        ray = g["template"]["spec"]["containers"][0]
        env = _env(ray)
        assert env["RAY_AUTH_MODE"] == "token", g.get("groupName", "head")
        assert env["RAY_AUTH_TOKEN"]["secretKeyRef"] == {"name": "raylane-ray-auth", "key": "auth_token"}
        assert g["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
        # ray.io/ labels are reserved: `ray start --labels` refuses them, so they come from env.
        assert not any(k.startswith("ray.io/") for k in g.get("labels", {}))


def test_raycluster_groups_carry_the_profile_labels_and_scheduling(rendered):
    name, docs = rendered
    spec = _one(docs, "RayCluster", "raylane")["spec"]
    profile = default_profile()
    workers = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert list(workers) == [g.name for g in profile.workers]  # KubeRay: RAY_NODE_TYPE_NAME = groupName
    assert _env(spec["headGroupSpec"]["template"]["spec"]["containers"][0])["RAY_NODE_MARKET_TYPE"] == "ON_DEMAND"
    for g in profile.workers:
        pod = workers[g.name]["template"]["spec"]
        assert _env(pod["containers"][0])["RAY_NODE_MARKET_TYPE"] == g.market
        if name == "local":  # kind/minikube: logical GPUs only, no spot or GPU nodes to select
            assert "nodeSelector" not in pod and "tolerations" not in pod
            assert deploy_render.NVIDIA_GPU not in json.dumps(pod["containers"][0].get("resources", {}))
            continue
        limits = pod["containers"][0]["resources"]["limits"]
        if g.gpus:
            assert limits[deploy_render.NVIDIA_GPU] == g.gpus
            assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        else:
            assert deploy_render.NVIDIA_GPU not in limits
        if g.is_spot:
            assert pod["nodeSelector"] == {"karpenter.sh/capacity-type": "spot"}
            assert any(t["key"] == "karpenter.sh/capacity-type" and t.get("value") == "spot" for t in pod["tolerations"])
        else:  # on-demand groups keep off spot nodes
            expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert {"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]} in \
                expr["nodeSelectorTerms"][0]["matchExpressions"]


def test_kuberay_autoscaler_sees_the_profile_groups(rendered):
    """What Ray's KubeRay autoscaler reads from each group: the profile's resources and bounds."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _node_type_from_group_spec

    _, docs = rendered
    spec = _one(docs, "RayCluster", "raylane")["spec"]
    profile = default_profile()
    head = _node_type_from_group_spec(spec["headGroupSpec"], is_head=True)
    assert head["resources"] == deploy_render.ray_resources(profile.head)
    for w in spec["workerGroupSpecs"]:
        g = profile.group(w["groupName"])
        t = _node_type_from_group_spec(w, is_head=False)
        assert t["resources"] == deploy_render.ray_resources(g), g.name
        assert (t["min_workers"], t["max_workers"]) == (g.min_nodes, g.max_nodes), g.name
        assert g.min_nodes <= w["replicas"] <= g.max_nodes


def test_control_plane_deployment(rendered):
    _, docs = rendered
    dep = _one(docs, "Deployment", "raylane")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert c["command"] == ["raylane-server", "serve"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    env = _env(c)
    assert env["RAYLANE_HOST"] == "0.0.0.0"
    assert env["RAYLANE_AUTO_MIGRATE"] == "false"  # the migration Job migrates
    assert env["RAYLANE_DASHBOARD_URL"] == "http://raylane-head-svc:8265"  # KubeRay: <cluster>-head-svc
    # The fast lane on (the product's default), with the GCS its store lives in named, not guessed.
    assert env["RAYLANE_FAST_LANE"] == "true" and env["RAYLANE_RAY_ADDRESS"] == "raylane-head-svc:6379"
    assert env["RAYLANE_DATABASE_URL"]["secretKeyRef"] == {"name": "raylane-db", "key": "url"}
    assert env["RAYLANE_RAY_AUTH_TOKEN"]["secretKeyRef"] == {"name": "raylane-ray-auth", "key": "auth_token"}
    # RAYLANE_PROFILE is a file of the mounted ConfigMap, and that file is the default profile.
    profile_path = Path(env["RAYLANE_PROFILE"])
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(profile_path.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    cm = _one(docs, "ConfigMap", volume["configMap"]["name"])
    assert Profile.model_validate(yaml.safe_load(cm["data"][profile_path.name])) == default_profile()
    # The Service and the PodDisruptionBudget select these pods.
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = _one(docs, "Service", "raylane")
    assert svc["spec"]["selector"].items() <= labels.items()
    pdb = _one(docs, "PodDisruptionBudget", "raylane")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_migration_job_runs_db_upgrade(rendered):
    _, docs = rendered
    job = _one(docs, "Job", "raylane-migrate")
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["raylane-server", "db", "upgrade"]
    assert _env(c)["RAYLANE_DATABASE_URL"]["secretKeyRef"] == {"name": "raylane-db", "key": "url"}
    assert c["image"] == _one(docs, "Deployment", "raylane")["spec"]["template"]["spec"]["containers"][0]["image"]


def _selects(selector: dict, labels: dict) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items()


def test_network_policy_lets_only_raylane_reach_ray_dashboard_and_gcs(rendered):
    _, docs = rendered
    pol = _one(docs, "NetworkPolicy", "raylane-ray")
    ray_head_pod = {"ray.io/cluster": "raylane", "ray.io/node-type": "head", "ray.io/group": "headgroup"}
    ray_worker_pod = {"ray.io/cluster": "raylane", "ray.io/node-type": "worker", "ray.io/group": "spot-cpu"}
    control_plane = _one(docs, "Deployment", "raylane")["spec"]["template"]["metadata"]["labels"]
    migrate = _one(docs, "Job", "raylane-migrate")["spec"]["template"]["metadata"]["labels"]
    stranger = {"app.kubernetes.io/name": "notebook"}
    assert pol["metadata"]["name"] and pol["spec"]["policyTypes"] == ["Ingress"]
    assert _selects(pol["spec"]["podSelector"], ray_head_pod) and _selects(pol["spec"]["podSelector"], ray_worker_pod)

    def allowed(src: dict, port: int) -> bool:
        for rule in pol["spec"]["ingress"]:
            ports = {p["port"] for p in rule.get("ports", [])}
            if ports and port not in ports:
                continue
            if any(_selects(f["podSelector"], src) for f in rule["from"]):
                return True
        return False

    for port in (8265, 6379):
        assert allowed(control_plane, port)
        assert allowed(ray_worker_pod, port)  # Ray's own nodes
        assert not allowed(migrate, port)
        assert not allowed(stranger, port)
    assert not allowed(control_plane, 10001)  # nothing but dashboard and GCS for the control plane
    redis = _one(docs, "NetworkPolicy", "raylane-redis")
    [rule] = redis["spec"]["ingress"]
    assert [f["podSelector"]["matchLabels"] for f in rule["from"]] == [{"ray.io/cluster": "raylane",
                                                                       "ray.io/node-type": "head"}]


def test_local_overlay_keeps_ray_resources_and_drops_scheduling_constraints():
    base = _one(kustomize_build(BASE), "RayCluster")
    local = _one(kustomize_build(K8S / "overlays" / "local"), "RayCluster")
    for b, l in zip(base["spec"]["workerGroupSpecs"], local["spec"]["workerGroupSpecs"]):
        assert b["resources"] == l["resources"] and b["maxReplicas"] == l["maxReplicas"]
    assert {d["kind"] for d in kustomize_build(K8S / "overlays" / "local")} >= {"StatefulSet"}


def test_cloud_overlay_sets_the_image_everywhere():
    docs = kustomize_build(K8S / "overlays" / "cloud")
    images = set(re.findall(r'"image": "([^"]+)"', json.dumps(docs)))
    ours = {i for i in images if "raylane" in i}
    assert ours == {"registry.example.com/raylane:0.1.0"}, images


# ---------------------------------------------------------------------------
# docker compose


class _Reset:
    """Compose's ``!reset`` tag: drop the key from the merged file."""


class _ComposeLoader(yaml.SafeLoader):
    pass


_ComposeLoader.add_constructor("!reset", lambda loader, node: _Reset())
_ComposeLoader.add_constructor("!override", lambda loader, node: (
    loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
    else loader.construct_mapping(node, deep=True)))


def _load_compose(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_ComposeLoader)


def _drop_resets(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_resets(v) for k, v in node.items() if not isinstance(v, _Reset)}
    return [_drop_resets(v) for v in node] if isinstance(node, list) else node


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if isinstance(v, _Reset):
                out.pop(k, None)
            else:
                out[k] = _merge(base[k], v) if k in base else _drop_resets(v)
        return out
    return _drop_resets(over)


@pytest.fixture(scope="module")
def compose_validator():
    schema = json.loads(_shared(COMPOSE_SCHEMA).read_text())
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def compose() -> dict:
    return _load_compose(COMPOSE)


@pytest.fixture(scope="module")
def compose_cpu(compose) -> dict:
    return _merge(compose, _load_compose(COMPOSE_CPU))


def _assert_valid(validator, doc: dict, what: str) -> None:
    errors = sorted(validator.iter_errors(doc), key=str)
    assert not errors, f"{what}: " + "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_compose_files_are_valid_compose(compose_validator, compose, compose_cpu):
    _assert_valid(compose_validator, compose, "docker-compose.yml")
    _assert_valid(compose_validator, _drop_resets(_load_compose(COMPOSE_CPU)), "docker-compose.cpu.yml")
    _assert_valid(compose_validator, compose_cpu, "docker-compose.yml + docker-compose.cpu.yml")


def test_compose_services_and_their_wiring(compose):
    s = compose["services"]
    assert {"postgres", "redis", "ray-head", "ray-gpu", "ray-spot", "ray-cpu", "raylane"} <= s.keys()
    assert s["postgres"]["healthcheck"]["test"] and any(v.endswith(":/var/lib/postgresql/data")
                                                         for v in s["postgres"]["volumes"])
    assert s["redis"]["healthcheck"]["test"]
    rl = s["raylane"]
    assert rl["command"] == ["sh", "-c", "raylane-server db upgrade && exec raylane-server serve"]
    env = rl["environment"]
    assert env["RAYLANE_DATABASE_URL"].startswith("postgresql+psycopg://") and "@postgres:5432/" in env["RAYLANE_DATABASE_URL"]
    assert env["RAYLANE_DASHBOARD_URL"] == "http://ray-head:8265"
    assert env["RAYLANE_HOST"] == "0.0.0.0"
    assert all(d["condition"] == "service_healthy" for d in rl["depends_on"].values())
    assert {"postgres", "ray-head"} <= rl["depends_on"].keys()
    head = s["ray-head"]["environment"]
    assert head["RAY_AUTH_MODE"] == "token"
    assert head["RAY_REDIS_ADDRESS"] == "redis:6379" and head["RAY_external_storage_namespace"]
    for name in ("ray-gpu", "ray-spot", "ray-cpu"):
        assert s[name]["environment"]["RAY_AUTH_MODE"] == "token"
        assert s[name]["depends_on"]["ray-head"]["condition"] == "service_healthy"
        assert "container_name" not in s[name]  # `--scale` needs generated names
    [dev] = s["ray-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"] and dev["count"] == default_profile().group("gpu").gpus
    assert s["ray-spot"]["environment"]["RAY_NODE_MARKET_TYPE"] == "SPOT"


def test_compose_secrets_are_required_and_ports_stay_local():
    text = COMPOSE.read_text()
    for var in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "RAY_AUTH_TOKEN"):
        uses = re.findall(r"\$\{" + var + r"([^}]*)\}", text)
        assert uses and all(u.startswith(":?") for u in uses), f"{var} must be required (${{{var}:?...}}): {uses}"
    published = {}
    for name, svc in yaml.safe_load(text)["services"].items():
        for p in svc.get("ports", []):
            published[name] = p
    # Only what a user needs: the API, and the dashboard on this host only.
    assert set(published) == {"raylane", "ray-head"}
    assert published["ray-head"] == "127.0.0.1:8265:8265"
    assert published["raylane"].startswith("${RAYLANE_BIND:-127.0.0.1}:")


def test_cpu_override_keeps_the_gpu_group_as_logical_gpus(compose_cpu):
    gpu = compose_cpu["services"]["ray-gpu"]
    assert "devices" not in gpu["deploy"]["resources"]["reservations"]
    flags = deploy_render.parse_ray_start(gpu["command"])
    assert flags["num-gpus"] == str(default_profile().group("gpu").gpus)


def test_every_ray_service_is_a_valid_ray_start(compose):
    """Ray's own `ray start` argument parser accepts each Ray service's command."""
    from ray.scripts.scripts import start

    ray_services = [n for n, s in compose["services"].items() if "RAY_NODE_TYPE_NAME" in s.get("environment", {})]
    assert len(ray_services) == len(default_profile().groups)
    for name in ray_services:
        argv = compose["services"][name]["command"]
        assert argv[:2] == ["ray", "start"], name
        ctx = start.make_context("start", list(argv[2:]))
        assert ctx.params["block"], f"{name}: a container's main process must block"
        if ctx.params["head"]:
            assert ctx.params["port"] == 6379 and ctx.params["dashboard_host"] == "0.0.0.0"
        else:
            assert ctx.params["address"] == deploy_render.COMPOSE_HEAD_ADDRESS


# ---------------------------------------------------------------------------
# The Ray cluster launcher (AWS)


def test_aws_config_passes_rays_own_schema_and_reader():
    from ray.autoscaler._private.util import prepare_config, validate_config
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

    cfg = prepare_config(yaml.safe_load(AWS.read_text()))
    validate_config(cfg)
    types = AutoscalingConfig(cfg, skip_content_hash=True).get_node_type_configs()
    profile = default_profile()
    assert set(types) == {g.name for g in profile.groups}
    for g in profile.groups:
        t = types[g.name]
        assert t.resources == deploy_render.ray_resources(g)
        assert t.labels == g.labels()
        if g.role == "worker":
            assert (t.min_worker_nodes, t.max_worker_nodes) == (g.min_nodes, g.max_nodes)
        market = cfg["available_node_types"][g.name]["node_config"].get("InstanceMarketOptions", {})
        assert (market.get("MarketType") == "spot") is g.is_spot


def test_aws_start_commands_turn_token_auth_on():
    from ray.scripts.scripts import start

    cfg = yaml.safe_load(AWS.read_text())
    assert cfg["file_mounts"] == {"~/.ray/auth_token": "~/.ray/auth_token"}
    for key, head in (("head_start_ray_commands", True), ("worker_start_ray_commands", False)):
        cmd = next(c for c in cfg[key] if "ray start" in c)
        words = shlex.split(cmd.split(";", 1)[1])
        env = dict(w.split("=", 1) for w in words if re.match(r"^[A-Za-z_]+=", w))
        assert env["RAY_AUTH_MODE"] == "token", key
        argv = [w for w in words if not re.match(r"^[A-Za-z_]+=", w)]
        assert argv[:2] == ["ray", "start"]
        assert start.make_context("start", argv[2:]).params["head"] is head


# ---------------------------------------------------------------------------
# One source of truth: the profile


@pytest.mark.parametrize("target,path", DEPLOY_FILES, ids=lambda x: str(x).replace(str(ROOT) + "/", ""))
def test_deploy_file_node_groups_match_the_profile(target, path):
    assert deploy_render.check(target, path) == []


def test_cpu_override_matches_the_profile(compose_cpu, tmp_path):
    merged = tmp_path / "docker-compose.merged.yml"
    merged.write_text(yaml.safe_dump(compose_cpu))
    assert deploy_render.check("compose", merged) == []


def test_kuberay_base_profile_copy_is_the_profile():
    assert Profile.load(BASE / "profile.yaml") == default_profile()


def _mutations() -> dict[str, Any]:
    def cpus(d):
        d["groups"][2]["cpus"] = 8

    def market(d):
        d["groups"][2]["market"] = "ON_DEMAND"

    def bounds(d):
        d["groups"][3]["max_nodes"] = 6
        d["groups"][3]["local_nodes"] = 2

    def accelerator(d):
        d["groups"][1]["accelerator"] = {"type": "A100", "count": 4}

    def memory(d):
        d["groups"][0]["memory_gb"] = 8

    def drop(d):
        del d["groups"][3]

    def add(d):
        d["groups"].append({"name": "spot-gpu", "market": "SPOT", "accelerator": {"type": "L4", "count": 1},
                            "cpus": 8, "memory_gb": 32, "max_nodes": 4})

    return {f.__name__: f for f in (cpus, market, bounds, accelerator, memory, drop, add)}


@pytest.mark.parametrize("mutation", list(_mutations()))
@pytest.mark.parametrize("target,path", DEPLOY_FILES, ids=lambda x: str(x).replace(str(ROOT) + "/", ""))
def test_a_changed_profile_makes_the_check_fail(mutation, target, path):
    data = yaml.safe_load(DEFAULT_PROFILE.read_text())
    changed = copy.deepcopy(data)
    _mutations()[mutation](changed)
    profile = Profile.model_validate(changed)
    drift = deploy_render.check(target, path, profile)
    assert drift, f"{mutation}: {path} still matches a changed profile"


def _script(name: str, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
            ) -> subprocess.CompletedProcess:
    """Run console script NAME as pyproject.toml's [project.scripts] declares it
    (``module:function``), with this environment's Python: the checkout under test,
    whichever scripts the environment happens to have installed."""
    scripts = re.search(r"\[project\.scripts\]\n(.*?)(?:\n\[|\Z)", (ROOT / "pyproject.toml").read_text(), re.S)
    target = dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.:]+)"', scripts.group(1), re.M)).get(name)
    assert target, f"pyproject.toml declares no console script {name!r}"
    module, func = target.split(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; {func}()"
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=120)


def _raylane(*args: str, **kw) -> subprocess.CompletedProcess:
    return _script("raylane", *args, **kw)


def _server(*args: str, **kw) -> subprocess.CompletedProcess:
    return _script("raylane-server", *args, **kw)


@pytest.mark.slow
def test_profile_render_command(tmp_path):
    for target, path in DEPLOY_FILES:
        out = _server("profile", "render", "--target", target)
        assert out.returncode == 0, out.stderr
        assert yaml.safe_load(out.stdout)
        ok = _server("profile", "render", "--target", target, "--check", str(path))
        assert ok.returncode == 0, ok.stderr
        assert "match" in ok.stdout
    data = yaml.safe_load((BASE / "profile.yaml").read_text())
    data["groups"][2]["cpus"] = 16
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(data))
    bad = _server("profile", "render", "--target", "aws", "--check", str(AWS), "--profile", str(changed))
    assert bad.returncode == 1
    assert "group spot-cpu" in bad.stderr and "CPU" in bad.stderr
    # The client's `raylane profile ...` hands over to raylane-server, unchanged.
    alias = _raylane("profile", "render", "--target", "compose")
    assert alias.returncode == 0 and alias.stdout == _server("profile", "render", "--target", "compose").stdout


def test_rendered_parts_read_back_as_the_profile(tmp_path):
    """What `render` prints, read back with the same readers, has no drift: render and check agree."""
    profile = default_profile()
    for target in deploy_render.TARGETS:
        f = tmp_path / f"{target}.yaml"
        f.write_text(deploy_render.render(target, profile))
        assert deploy_render.check(target, f, profile) == [], target


# ---------------------------------------------------------------------------
# The Dockerfile


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        instr, _, args = buf.strip().partition(" ")
        out.append((instr.upper(), args.strip()))
        buf = ""
    return out


def _exec_form(args: str) -> list[str]:
    return json.loads(args) if args.startswith("[") else ["/bin/sh", "-c", args]


def test_dockerfile_is_multi_stage_pinned_and_non_root():
    steps = _dockerfile()
    args = dict(a.split("=", 1) for i, a in steps if i == "ARG" and "=" in a)
    froms = [a for i, a in steps if i == "FROM"]
    assert len(froms) >= 2, "multi-stage"
    base = args.get("PYTHON_IMAGE", "")
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base) or base.startswith("rayproject/ray:2.60.0-py311"), base
    runs = [a for i, a in steps if i == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert any("-c constraints.txt" in r and '".[server]"' in r for r in installs), installs
    assert "ray==2.60.0" in (ROOT / "constraints.txt").read_text().splitlines()
    final = steps[max(i for i, (instr, _) in enumerate(steps) if instr == "FROM"):]
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users


def test_dockerfile_copies_exist_and_cover_every_package():
    copied: list[str] = []
    for instr, args in _dockerfile():
        if instr != "COPY" or "--from=" in args:
            continue
        *sources, _dest = shlex.split(args)
        copied += sources
    for src in copied:
        assert (ROOT / src).exists(), f"Dockerfile copies {src}, which does not exist"
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for src in copied:
        assert src.rstrip("/") not in ignored, f"{src} is copied but .dockerignore drops it"
    # The folders of [tool.setuptools.package-dir] ("raylane.orchestrator" = "orchestrator", ...;
    # no tomllib on Python 3.10)
    table = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?=^\[|\Z)",
                      (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    packages = re.findall(r'^"[^"]+"\s*=\s*"([^"]+)"', table.group(1), re.M)
    assert "raylane" in packages and "orchestrator" in packages, packages
    names = {s.rstrip("/") for s in copied}
    assert {"pyproject.toml", "constraints.txt"} <= names
    assert set(packages) <= names, f"packages not copied into the image: {set(packages) - names}"


@pytest.mark.slow
def test_image_commands_run(tmp_path):
    """The image's command, compose's migrate-then-serve and the Kubernetes migration
    Job, run from this environment's install against a throwaway SQLite database."""
    steps = _dockerfile()
    entry = [_exec_form(a) for i, a in steps if i == "ENTRYPOINT"]
    cmd = [_exec_form(a) for i, a in steps if i == "CMD"][-1]
    argv = (entry[-1] if entry else []) + cmd
    assert argv[0] == "raylane-server", argv
    env = {"RAYLANE_DATA_DIR": str(tmp_path / "data"), "RAYLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'r.db'}"}
    # The image's command, asked for its help instead of serving forever.
    out = _script(argv[0], *argv[1:], "--help", env=env)
    assert out.returncode == 0 and "Run the control plane" in out.stdout, out.stderr
    assert _raylane("--help", env=env).returncode == 0
    # compose: `raylane-server db upgrade && exec raylane-server serve`; run the part before serve.
    compose_cmd = yaml.safe_load(COMPOSE.read_text())["services"]["raylane"]["command"]
    first = shlex.split(compose_cmd[2].split("&&")[0])
    assert first == ["raylane-server", "db", "upgrade"]
    out = _script(first[0], *first[1:], env=env, cwd=tmp_path)
    assert out.returncode == 0 and "database at head" in out.stdout, out.stderr
    # Kubernetes: the migration Job, again (migrations are idempotent).
    job = _one(kustomize_build(BASE), "Job", "raylane-migrate")["spec"]["template"]["spec"]["containers"][0]
    out = _script(job["command"][0], *job["command"][1:], env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import sqlalchemy

    from raylane.orchestrator.store import migrate

    engine = sqlalchemy.create_engine(env["RAYLANE_DATABASE_URL"])
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()


def test_deploy_guide_covers_every_target():
    text = (ROOT / "docs" / "deploy.md").read_text()
    for must in ("docker compose", "docker-compose.cpu.yml", "--scale ray-spot", "kubectl apply -k",
                 "overlays/local", "overlays/cloud", "ray up deploy/ray-cluster-aws.yaml", "raylane-server db upgrade",
                 "pg_dump", "cloud.google.com/gke-spot", "eks.amazonaws.com/capacityType",
                 "raylane-server profile render"):
        assert must in text, f"docs/deploy.md does not mention {must!r}"


def test_compose_job_storage_is_one_volume_every_node_and_the_control_plane_mount(compose, compose_cpu):
    """Checkpoints written on one node must be found on another (issue #13, point 3):
    the storage URI is a path that every Ray node and the control plane mount from
    the same volume, never the control plane's data_dir."""
    for doc in (compose, compose_cpu):
        s = doc["services"]
        uri = s["raylane"]["environment"]["RAYLANE_STORAGE_URI"]
        path = uri.split(":-", 1)[1].rstrip("}") if uri.startswith("${") else uri
        assert path.startswith("/") and not path.startswith("/var/lib/raylane")
        for name in ("raylane", "ray-head", "ray-gpu", "ray-spot", "ray-cpu"):
            assert f"jobstorage:{path}" in s[name].get("volumes", []), name
        assert "jobstorage" in doc["volumes"]


def test_compose_control_plane_runs_the_fast_lane_with_the_gcs_named(compose):
    env = compose["services"]["raylane"]["environment"]
    assert env["RAYLANE_FAST_LANE"] == "${RAYLANE_FAST_LANE:-true}"  # on, and one variable turns it off
    assert env["RAYLANE_RAY_ADDRESS"] == "ray-head:6379"
