"""The autoscaling local cluster's config for Ray's autoscaler, from the profile
(no Ray started): what admission counts is what the autoscaler may start."""

from __future__ import annotations

from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.tooling.autoscaling import AUTOSCALE_PROFILE, autoscaling_config


def test_node_types_are_the_profile_groups_with_labels_bounds_and_the_explicit_gcs_address():
    profile = Profile.load(AUTOSCALE_PROFILE)
    cfg = autoscaling_config(profile, "127.0.0.1:45678")
    # Ray's fake multi-node provider, as an external module (the wheel lacks its defaults file, which v2 reads)
    assert cfg["provider"]["module"].endswith("fake_multi_node.node_provider.FakeMultiNodeProvider")
    assert cfg["provider"]["gcs_address"] == "127.0.0.1:45678"  # never Ray's default 6379 (Redis here)
    types = cfg["available_node_types"]
    assert set(types) == {"ray.head.default", "gpu", "spot-cpu", "cpu"}
    assert types["ray.head.default"]["resources"] == {"CPU": 0}  # the head runs no jobs
    gpu, spot = types["gpu"], types["spot-cpu"]
    assert gpu["labels"] == {"ray.io/node-group": "gpu", "ray.io/market-type": "ON_DEMAND"}
    assert spot["labels"] == {"ray.io/node-group": "spot-cpu", "ray.io/market-type": "SPOT"}
    assert (gpu["min_workers"], gpu["max_workers"], spot["min_workers"]) == (0, 1, 0)
    assert gpu["resources"]["GPU"] == 2 and gpu["resources"]["accelerator_type:H100"] == 1
    assert "memory" not in gpu["resources"]  # Ray refuses memory as a node type's custom resource
    assert cfg["max_workers"] == sum(g.max_nodes for g in profile.workers)
