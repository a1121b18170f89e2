"""autotune: find the fastest way to train a model on a GPU cluster."""

__version__ = "0.1.0"
