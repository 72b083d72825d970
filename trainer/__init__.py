"""The online trainer, in wings (top to bottom; a layers contract in pyproject.toml keeps them so):
loop/ (the learning loop), gate/ (the promotion gate), publishing/ (versions, publish, push,
rollback), swap/ (verified swaps), weight_update/ (how a version's weights reach a backend),
backends/ (the trainer's client of a vLLM server), models/ (model tooling). The code that runs
inside vLLM is the package rlgw_vllm."""
