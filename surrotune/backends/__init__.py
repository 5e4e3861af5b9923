"""Backends turn configurations into Results: ``cuda`` (a live GPU), ``replay`` (a recording)."""

__all__: list[str] = []
