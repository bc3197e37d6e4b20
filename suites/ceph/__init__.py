"""Ceph behind XRootD gateways (seed 002, RAL Echo): hot file, read and readv latency."""
