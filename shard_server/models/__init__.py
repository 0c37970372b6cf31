"""Model families (`llama.py` covers Llama, Mistral, Qwen2, Qwen3 and SmolLM2).

`registry.build_model` picks the implementation from config.json's model_type.
"""
