"""Models: build or load a model and its tokenizer, prompts and chat templates, LoRA, model cards."""
