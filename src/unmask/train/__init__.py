"""Training: the loop, optimizer, checkpoints."""
