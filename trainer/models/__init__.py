"""Model tooling: create a model (init_model, model_families, byte_model, bpe_tokenizer),
warm-start it on the demo task, and the weights of a torch model (weights) and its LoRA adapter
(lora)."""
