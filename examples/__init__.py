"""Runnable examples: each a spec (YAML) plus its code. Submit one with
`raylane submit examples/<name>.yaml` against `make run`."""
