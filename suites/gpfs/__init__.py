"""GPFS (seed 001, BNL): dd-like sequential I/O, ls under writes, killed-writer leftovers."""
