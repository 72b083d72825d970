"""The trainer's view of a serving backend: its control endpoints (vllm_control) and the probe
scores that check it serves what the trainer computed (parity)."""
