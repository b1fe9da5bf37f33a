"""recsvc: differentially private item selection for recommenders."""

__version__ = "0.1.0"
