"""The floor everything stands on: the one error for bad input, packaged data, integer helpers,
number and path checks, whole-file writes and the output folder lock."""
