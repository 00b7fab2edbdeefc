"""The Raylane client: SDK (``raylane.client.sdk``) and CLI (``raylane.client.cli``).

Importable without Ray, SQLAlchemy or FastAPI; ``import raylane`` is the public face.
"""
