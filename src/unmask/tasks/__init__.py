"""Tasks: what a head, its data and its metrics need."""
