"""Hopper (sm_90a) kernels."""
