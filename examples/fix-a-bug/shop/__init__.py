"""A tiny shop: the code the example's loop repairs."""
