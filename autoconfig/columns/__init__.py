"""Typed specs turned into the cost model's input columns: the one builder, the measured kernel
tables each GPU is timed by, and what a framework overlaps and fuses."""
