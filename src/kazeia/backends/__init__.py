"""Backends: the devices a graph's nodes run on (devices.py is the registry), each behind base.Backend."""
