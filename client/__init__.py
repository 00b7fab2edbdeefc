"""The Raylane client: SDK (``client.sdk``) and CLI (``client.cli``).

Importable without Ray, SQLAlchemy or FastAPI; ``import raylane`` is the public face.
"""
