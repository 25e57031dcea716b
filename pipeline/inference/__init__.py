"""Sampling: the decode loop, engines (transformers, vLLM), the OpenAI-compatible server and backend."""
