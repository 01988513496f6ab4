"""The bundled trainer: torch-native TP/SP/PP/DP runs that measure what the cost model predicts."""
