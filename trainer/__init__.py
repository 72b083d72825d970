"""The online trainer, the swap coordinator and the vLLM plugin and worker extension."""
