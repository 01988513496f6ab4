"""RL post-training planning on top of the training and serving models: a step's rollout,
training, weight sync and switching, composed by placement, and the plans ranked."""
