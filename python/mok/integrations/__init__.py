"""mok inside other libraries' models: `mok.integrations.transformers` (HuggingFace transformers 5.x)."""
