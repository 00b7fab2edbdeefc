"""Service functions the API calls: the control plane (submit, read, cancel),
access (tokens, projects, quotas, audit), accounting and the metrics collector."""
