"""The loops that drive jobs: the dispatcher (admit, claim, submit) and the
reconciler (Ray's view -> database; ``classify`` says why an attempt failed). They hold decisions only:
every statement is in ``orchestrator.store``, every rule in ``orchestrator.domain``."""
