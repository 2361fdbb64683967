"""Encoder architectures, one file each."""
