"""What the tool talks about: closed vocabularies, the layout and its dimensions, typed specs of
models, GPUs and frameworks, the shipped catalog, and the machine it runs on."""
