"""Inference: fill-mask and friends."""
