"""Data: readers, masking, collation."""
