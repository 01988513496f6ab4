"""Published rows read and completed: training and serving CSVs parsed into specs and layouts,
and the settings a row leaves unknown resolved as its framework would run them."""
