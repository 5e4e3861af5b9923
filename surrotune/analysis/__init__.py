"""Offline analysis of stored studies: exports now; reports and learned rules to come."""

__all__: list[str] = []
