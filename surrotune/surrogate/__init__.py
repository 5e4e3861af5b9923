"""The surrogate sampler (XGBoost performance model, failure classifier, diversity): to come."""

__all__: list[str] = []
