"""The domain: what a job is and what may happen to it. Pure (pydantic and yaml
only, no database, no Ray), so the client can import it too.

- ``specs``: the job spec, the one schema of API, SDK and runners;
- ``kinds``: one row of traits per job kind, read by everything that differs by kind;
- ``states``: job and attempt statuses with their arrows, and the failure-cause table;
- ``routing``: spec + profile + live cluster -> placement, with reasons;
- ``policy``: what a job may run (pip, working_dir, env vars, size);
- ``profile``: node groups, declared once; ``costs``: prices and utilisation;
- ``views``: the shapes the API returns; ``errors``: typed domain errors; ``ids``: ids.
"""
