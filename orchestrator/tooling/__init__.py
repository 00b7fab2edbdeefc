"""Dev and deploy tooling, outside the orchestrator's core: the local multi-node
Ray cluster and the deploy files rendered from the cluster profile."""
