"""Adapters that let other libraries call fa4's kernels (imported on demand, never by fa4 itself)."""
