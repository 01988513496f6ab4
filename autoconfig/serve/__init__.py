"""Serving: the inference search, batch predictions and measured generation trials."""
