"""The model held against measurements (used by scripts/): the shared constants' fit, each
source group left out, validation of training and serving predictions, micro-batch analysis."""
